// The members page: a change the portal refuses (the last admin, someone who cannot be
// added) answers 400 with the members fragment saying why; htmx swaps only 2xx answers unless
// told, so swap that one too, in place of the fragment.
(function () {
  "use strict";
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target;
    if (target && target.id === "members" && event.detail.xhr.status === 400) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });
  // After a swap, put the keyboard where the answer is: the message, else the list.
  document.addEventListener("htmx:afterSwap", function (event) {
    var panel = document.getElementById("members");
    if (!panel || event.detail.target !== panel) return;
    var said = panel.querySelector("[role=alert], [role=status]");
    if (said) {
      said.setAttribute("tabindex", "-1");
      said.focus();
    }
  });
})();
