// The index page's search box and tag filters. The catalog is embedded in the page as JSON, so the page
// works from file:// with no server and no network. The ranking is `tritonkit index search`'s: the page embeds
// each entry's ranking record (name, tags, words) and the weights from tritonkit/index/search.py, and score()
// below is score_record() there, line for line. Entries that match every word typed (and carry every tag
// pressed) are shown best first, ties by name; with nothing typed, all of them by name.
"use strict";

(function () {
  const data = JSON.parse(document.getElementById("catalog-data").textContent);
  const weights = data.weights;
  const byName = new Map(data.entries.map((record) => [record.name, record]));
  const search = document.getElementById("search");
  const count = document.getElementById("count");
  const list = document.getElementById("entries");
  const items = Array.from(list.querySelectorAll("li.entry"));
  const buttons = Array.from(document.querySelectorAll("#tags button.tag"));
  const pressed = new Set();

  // Python's str.split(): runs of whitespace, no empty words.
  function queryWords(query) {
    return query.trim().toLowerCase().split(/\s+/).filter((word) => word.length > 0);
  }

  function score(record, rawQuery) {
    const query = rawQuery.trim().toLowerCase();
    const name = record.name;
    let total = 0;
    if (query === name) {
      total += weights.exact_name;
    } else if (query && name.includes(query)) {
      total += weights.name_contains_query;
    }
    const tags = new Set(record.tags);
    const text = new Set(record.words);
    for (const word of queryWords(query)) {
      let wordScore = 0;
      if (tags.has(word)) wordScore += weights.tag;
      if (name.includes(word)) wordScore += weights.name_contains_word;
      if (text.has(word)) wordScore += weights.text_word;
      if (wordScore === 0) return 0;
      total += wordScore;
    }
    return total;
  }

  function byScoreThenName(a, b) {
    if (a.score !== b.score) return b.score - a.score;
    return a.name < b.name ? -1 : a.name > b.name ? 1 : 0;
  }

  function update() {
    const query = search.value;
    const typed = queryWords(query).length > 0;
    const ranked = items.map((item) => {
      const record = byName.get(item.dataset.name);
      const tagsOk = Array.from(pressed).every((tag) => record.tags.includes(tag));
      const value = typed ? score(record, query) : 0;
      return { item: item, name: item.dataset.name, score: value, visible: tagsOk && (!typed || value > 0) };
    });
    ranked.sort(byScoreThenName);
    let shown = 0;
    for (const entry of ranked) {
      entry.item.hidden = !entry.visible;
      entry.item.dataset.score = String(entry.score);
      list.appendChild(entry.item); // in ranked order
      shown += entry.visible ? 1 : 0;
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
