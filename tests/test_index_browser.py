"""The rendered index site in a real browser: headless Chromium (Debian's package) driven by Selenium through
chromedriver, the page opened from file:// with no server and no network.

A missing browser or driver is a failure with the command that installs them (`make browser-deps`), not a skip.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tritonkit.index import catalog as catalog_module
from tritonkit.index import render

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")  # fmt: skip
WAIT_S = 10


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Path, catalog_module.Catalog]:
    catalog = catalog_module.load()
    out = tmp_path_factory.mktemp("site")
    render.render_html(catalog, out)
    return out, catalog


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not found: the browser test needs Debian's chromium and "
                    "chromium-driver (run `make browser-deps` as root)")  # fmt: skip
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: pip install -e '.[test]'")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    profile = tmp_path_factory.mktemp("chromium-profile")
    options.add_argument(f"--user-data-dir={profile}")
    # An explicit driver path: Selenium Manager (which would download one) is never involved.
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(WAIT_S)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def visible_names(driver) -> list[str]:
    from selenium.webdriver.common.by import By

    return [li.get_attribute("data-name") for li in driver.find_elements(By.CSS_SELECTOR, "#entries li.entry")
            if li.is_displayed()]  # fmt: skip


def wait_for_count(driver, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT_S).until(expected_conditions.text_to_be_present_in_element((By.ID, "count"), text))


def test_search_tags_and_entry_page(browser, site):
    from selenium.webdriver.common.by import By

    out, catalog = site
    total = len(catalog.entries)
    browser.get((out / "index.html").as_uri())
    wait_for_count(browser, f"{total} of {total} kernels shown")
    assert len(visible_names(browser)) == total

    # typing filters the list to the entries whose text has every word
    search = browser.find_element(By.ID, "search")
    search.send_keys("rope")
    expected = [e.name for e in catalog.entries if "rope" in render.page_search_text(e)]
    wait_for_count(browser, f"{len(expected)} of {total} kernels shown")
    assert visible_names(browser) == expected
    assert {"liger-rope", "unsloth-rope"} <= set(expected) and "rms_norm" not in expected

    # a tag filter narrows the list; with a word typed as well, narrower still
    search.clear()
    search.send_keys(" ")  # clear() fires no input event: send one
    browser.find_element(By.CSS_SELECTOR, 'button.tag[data-tag="attention"]').click()
    attention = [e.name for e in catalog.entries if "attention" in e.tags]
    wait_for_count(browser, f"{len(attention)} of {total} kernels shown")
    assert visible_names(browser) == attention
    search.send_keys("paged")
    paged = [e.name for e in catalog.entries if "attention" in e.tags and "paged" in render.page_search_text(e)]
    wait_for_count(browser, f"{len(paged)} of {total} kernels shown")
    assert visible_names(browser) == paged and "xformers-flash-decoding-splitk" in paged

    # an entry page opens from the list and shows its usage
    browser.find_element(By.LINK_TEXT, "xformers-flash-decoding-splitk").click()
    usage = browser.find_element(By.CSS_SELECTOR, "pre code#usage").text
    assert "memory_efficient_attention_forward" in usage
    assert browser.find_element(By.TAG_NAME, "h1").text == "xformers-flash-decoding-splitk"


def test_our_kernel_page_shows_the_measurement_and_its_plots(browser, site):
    from selenium.webdriver.common.by import By

    out, catalog = site
    entry = catalog.get("rms_norm")
    browser.get((out / "entries" / "rms_norm.html").as_uri())
    assert browser.find_element(By.ID, "measured").text == entry.measurement.line()
    images = browser.find_elements(By.TAG_NAME, "img")
    assert len(images) == len(entry.measurement.plots) > 0
    # every plot loaded from the copied files (a broken image has natural width 0)
    assert all(browser.execute_script("return arguments[0].naturalWidth", img) > 0 for img in images)
    assert entry.usage.splitlines()[0] in browser.find_element(By.ID, "usage").text
