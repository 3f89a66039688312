// Fills in the recurring list's "Last fired" column, which the page was
// drawn without: a schedule's last fire is a search of its occurrences, one
// for each row. Each cell asks /ui/recurring/last, a few at a time so that a
// long list does not send hundreds of searches at once. Without JavaScript
// each cell links to the schedule's page, which shows it.
(function () {
  var cells = Array.prototype.slice.call(document.querySelectorAll("td[data-last]"));
  var inFlight = 4;
  function text(el, s, cls) {
    var sp = document.createElement("small");
    if (cls) {
      sp.className = cls;
    }
    sp.textContent = s;
    el.replaceChildren(sp);
  }
  function next() {
    var el = cells.shift();
    if (!el) {
      return;
    }
    fetch(el.dataset.last, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        return r.json();
      })
      .then(function (v) {
        if (v.error) {
          text(el, "unavailable: " + v.error, "warn");
        } else if (v.none) {
          text(el, "none kept");
        } else {
          var a = document.createElement("a");
          a.href = "/ui/event?id=" + encodeURIComponent(v.id);
          a.textContent = v.fired_at;
          var sp = document.createElement("small");
          sp.textContent = " " + v.in + ", " + v.late + " late";
          el.replaceChildren(a, sp);
        }
      })
      .catch(function (e) {
        text(el, "unavailable: " + String(e), "warn");
      })
      .finally(next);
  }
  for (var i = 0; i < inFlight; i++) {
    next();
  }
})();
