// Fills in the events page's count, which the page was shown without: a
// count of a broad filter reads every match and takes longer than the
// first page. It asks /ui/events/count with the page's filter. Without
// JavaScript, the link in its place reloads the page waiting for the count.
(function () {
  var el = document.getElementById("count-pending");
  if (!el) {
    return;
  }
  function unavailable(why) {
    var w = document.createElement("span");
    w.className = "warn";
    w.title = why;
    w.textContent = "count unavailable";
    el.replaceWith(w);
  }
  fetch(el.dataset.count, { credentials: "same-origin", headers: { Accept: "application/json" } })
    .then(function (r) {
      return r.json();
    })
    .then(function (v) {
      if (typeof v.count !== "number") {
        unavailable(v.error || "the count did not answer");
        return;
      }
      var n = document.createElement("strong");
      n.id = "count";
      n.textContent = String(v.count);
      el.replaceWith(n, " events match");
    })
    .catch(function (e) {
      unavailable(String(e));
    });
})();
