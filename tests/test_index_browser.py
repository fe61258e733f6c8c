"""The rendered index site in a real browser: headless Chromium (Debian's package) driven by Selenium through
chromedriver, the page opened from file:// with no server and no network.

Where Debian's chromium and chromium-driver are missing, the tests skip with the packages to install: the test suite
installs nothing on the host. CI (.ci/run) installs both first, so there they always run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tritonkit.index import catalog as catalog_module
from tritonkit.index import render, search

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
        pytest.skip(f"{' and '.join(missing)} not found: the browser test needs Debian's packages chromium and "
                    "chromium-driver (sudo apt-get install chromium chromium-driver)")  # fmt: skip
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


# One script per read: WebDriver's per-element calls (get_attribute, is_displayed) are a round trip each, and a
# page of a few hundred entries read that way after every query took most of a minute.
_VISIBLE_ENTRIES = """
return Array.from(document.querySelectorAll('#entries li.entry'))
    .filter(li => li.checkVisibility())
    .map(li => [li.dataset.name, li.dataset.score]);
"""


def visible_entries(driver) -> list[tuple[str, str]]:
    """(name, data-score) of the entries shown, in the page's order."""
    return [tuple(pair) for pair in driver.execute_script(_VISIBLE_ENTRIES)]


def visible_names(driver) -> list[str]:
    """The entries shown, in the page's order."""
    return [name for name, _ in visible_entries(driver)]


def visible_scores(driver) -> list[int]:
    return [int(score) for _, score in visible_entries(driver)]


def wait_for_count(driver, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT_S).until(expected_conditions.text_to_be_present_in_element((By.ID, "count"), text))


def type_query(driver, query: str) -> None:
    """Replace the search box's text with ``query`` through the input events a user's typing fires."""
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.ID, "search")
    driver.execute_script("arguments[0].value = ''", box)
    box.send_keys(query or " ")  # an input event even for an empty query (a space is no word)


# Queries a reader would type: an exact name, a name part, a tag, a word of descriptions, two words (AND), a
# joined word and its part, a dtype, mixed case and spaces, and one that matches nothing.
QUERIES = ["rope", "rms_norm", "norm", "attention", "layer norm", "flash-decoding", "decoding", "fp8 matmul",
           "bfloat16", "  Softmax  ", "LoRA", "cross entropy", "zzz-no-such-kernel"]  # fmt: skip


def test_the_site_ranks_as_the_cli_does(browser, site):
    """The page's search is `tritonkit index search`: the same entries, in the same order, with the same scores."""
    out, catalog = site
    total = len(catalog.entries)
    browser.get((out / "index.html").as_uri())
    wait_for_count(browser, f"{total} of {total} kernels shown")
    assert visible_names(browser) == [e.name for e in catalog.entries]  # nothing typed: all, by name
    for query in QUERIES:
        expected = search.search(catalog.entries, query)
        type_query(browser, query)
        wait_for_count(browser, f"{len(expected)} of {total} kernels shown")
        assert visible_names(browser) == [e.name for _, e in expected], query
        assert visible_scores(browser) == [score for score, _ in expected], query
    cli = [line.split()[1] for line in _cli_search("rope").splitlines()[2:]]
    type_query(browser, "rope")
    wait_for_count(browser, f"{len(cli)} of {total} kernels shown")
    assert visible_names(browser) == cli and cli[0] == "rope"


def _cli_search(query: str) -> str:
    import contextlib
    import io

    from tritonkit.cli import main

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["index", "search", *query.split()]) == 0
    return buffer.getvalue()


def test_search_tags_and_entry_page(browser, site):
    from selenium.webdriver.common.by import By

    out, catalog = site
    total = len(catalog.entries)
    browser.get((out / "index.html").as_uri())
    wait_for_count(browser, f"{total} of {total} kernels shown")
    assert len(visible_names(browser)) == total

    # typing ranks the entries whose text has every word, best first
    type_query(browser, "rope")
    expected = [e.name for _, e in search.search(catalog.entries, "rope")]
    wait_for_count(browser, f"{len(expected)} of {total} kernels shown")
    assert visible_names(browser) == expected
    assert {"liger-rope", "unsloth-rope"} <= set(expected) and "rms_norm" not in expected

    # a tag filter narrows the list (the CLI's --tag); with a word typed as well, narrower still
    type_query(browser, "")
    browser.find_element(By.CSS_SELECTOR, 'button.tag[data-tag="attention"]').click()
    attention = [e.name for e in catalog.entries if "attention" in e.tags]
    wait_for_count(browser, f"{len(attention)} of {total} kernels shown")
    assert visible_names(browser) == attention
    type_query(browser, "paged")
    paged = [e.name for _, e in search.search(catalog.entries, "paged", tag="attention")]
    wait_for_count(browser, f"{len(paged)} of {total} kernels shown")
    assert visible_names(browser) == paged and "xformers-flash-decoding-splitk" in paged

    # an entry page opens from the list and shows its usage
    browser.find_element(By.LINK_TEXT, "xformers-flash-decoding-splitk").click()
    usage = browser.find_element(By.CSS_SELECTOR, "pre code#usage").text
    assert "memory_efficient_attention_forward" in usage
    assert browser.find_element(By.TAG_NAME, "h1").text == "xformers-flash-decoding-splitk"


def test_our_kernel_page_shows_the_measured_table_and_its_plots(browser, site):
    from selenium.webdriver.common.by import By

    out, catalog = site
    entry = catalog.get("rms_norm")
    browser.get((out / "entries" / "rms_norm.html").as_uri())
    rows = browser.find_elements(By.CSS_SELECTOR, "table#measured tr[data-mode]")
    assert [[td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in rows] == entry.measurement.table()
    assert [row.get_attribute("data-mode") for row in rows] == ["fwd", "bwd", "fwd+bwd"]
    images = browser.find_elements(By.TAG_NAME, "img")
    assert len(images) == len(entry.measurement.plots) == 3  # one a mode, not every plot of the day
    # every plot loaded from the copied files (a broken image has natural width 0)
    assert all(browser.execute_script("return arguments[0].naturalWidth", img) > 0 for img in images)
    assert entry.usage.splitlines()[0] in browser.find_element(By.ID, "usage").text
