// A log tail (<pre class="log">) reads from its end: show the newest lines, keep them in view
// when htmx swaps in a fresher copy of the page's live part, but leave a reader who scrolled up
// where they are. Each tail carries data-log-key (its attempt): a new host's log starts pinned.
(function () {
  "use strict";
  var SLACK_PX = 4; // fractional pixels: "at the end" need not be exact
  var before = {}; // data-log-key -> {pinned, top}, taken just before a swap

  function tails() {
    return document.querySelectorAll("pre.log");
  }

  function atEnd(el) {
    return el.scrollHeight - el.scrollTop - el.clientHeight <= SLACK_PX;
  }

  function toEnd(el) {
    el.scrollTop = el.scrollHeight;
  }

  function remember() {
    before = {};
    tails().forEach(function (el) {
      before[el.dataset.logKey] = { pinned: atEnd(el), top: el.scrollTop };
    });
  }

  function restore() {
    tails().forEach(function (el) {
      var was = before[el.dataset.logKey];
      if (!was || was.pinned) {
        toEnd(el);
      } else {
        el.scrollTop = was.top;
      }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    tails().forEach(toEnd);
  });
  document.addEventListener("htmx:beforeSwap", remember);
  // afterSwap runs in the same task as the swap itself: the new lines are never shown unpinned.
  document.addEventListener("htmx:afterSwap", restore);
})();
