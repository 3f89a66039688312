// Asks before a change: each action form names what it changes in its
// data-confirm attribute. Without JavaScript the forms submit directly
// (every change is still version-checked by the server).
document.querySelectorAll("form[data-confirm]").forEach(function (f) {
  f.addEventListener("submit", function (e) {
    if (!window.confirm(f.dataset.confirm)) {
      e.preventDefault();
    }
  });
});
