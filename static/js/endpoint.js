// The endpoint page: the curl example's Copy button (shown only where the clipboard can be
// written; elsewhere the example is selected and copied by hand).
(function () {
  "use strict";

  document.addEventListener("DOMContentLoaded", function () {
    if (!navigator.clipboard || !window.isSecureContext) return;
    document.querySelectorAll("button[data-copy]").forEach(function (button) {
      var source = document.getElementById(button.dataset.copy);
      if (!source) return;
      button.hidden = false;
      button.addEventListener("click", function () {
        navigator.clipboard.writeText(source.textContent).then(function () {
          button.firstChild.textContent = "Copied";
          window.setTimeout(function () {
            button.firstChild.textContent = "Copy";
          }, 2000);
        });
      });
    });
  });
})();
