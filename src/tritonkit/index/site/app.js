// The index page's search box and tag filters. The catalog is embedded in the page as JSON, so the page
// works from file:// with no server and no network. An entry stays visible when every word typed appears in
// its name, tags, description, author or dtypes, and it carries every tag pressed.
"use strict";

(function () {
  const records = JSON.parse(document.getElementById("catalog-data").textContent);
  const byName = new Map(records.map((record) => [record.name, record]));
  const search = document.getElementById("search");
  const count = document.getElementById("count");
  const items = Array.from(document.querySelectorAll("#entries li.entry"));
  const buttons = Array.from(document.querySelectorAll("#tags button.tag"));
  const pressed = new Set();

  function matches(record, words) {
    const tagsOk = Array.from(pressed).every((tag) => record.tags.includes(tag));
    return tagsOk && words.every((word) => record.text.includes(word));
  }

  function update() {
    const words = search.value.toLowerCase().split(/\s+/).filter((word) => word.length > 0);
    let shown = 0;
    for (const item of items) {
      const visible = matches(byName.get(item.dataset.name), words);
      item.hidden = !visible;
      shown += visible ? 1 : 0;
    }
    count.textContent = shown + " of " + items.length + " kernels shown";
  }

  for (const button of buttons) {
    button.addEventListener("click", () => {
      const tag = button.dataset.tag;
      if (pressed.has(tag)) {
        pressed.delete(tag);
      } else {
        pressed.add(tag);
      }
      button.setAttribute("aria-pressed", pressed.has(tag) ? "true" : "false");
      update();
    });
  }
  search.addEventListener("input", update);
  update();
})();
