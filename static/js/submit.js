// The submit page: the live check learns which files the chosen project zip holds (read
// here, from the zip's central directory, so the zip is not uploaded on every keystroke),
// Submit is disabled while the check shows problems, and a refused submission shows its
// problems in place, so the chosen files stay chosen.
(function () {
  "use strict";

  var END_OF_DIRECTORY = 0x06054b50;
  var DIRECTORY_ENTRY = 0x02014b50;
  var MAX_NAMES = 5000; // the server's limit on files in a bundle

  // The member names of a zip File, or null when they cannot be read here (ZIP64, a
  // damaged or unusual zip): the server then checks the zip when it is submitted.
  function listZip(file) {
    var tailSize = Math.min(file.size, 22 + 65535);
    return file.slice(file.size - tailSize).arrayBuffer().then(function (tail) {
      var view = new DataView(tail);
      for (var at = tail.byteLength - 22; at >= 0; at--) {
        if (view.getUint32(at, true) !== END_OF_DIRECTORY) continue;
        var count = view.getUint16(at + 10, true);
        var size = view.getUint32(at + 12, true);
        var offset = view.getUint32(at + 16, true);
        if (count === 0xffff || size === 0xffffffff || offset === 0xffffffff) return null;
        if (count > MAX_NAMES || offset + size > file.size) return null;
        return file.slice(offset, offset + size).arrayBuffer().then(function (directory) {
          return entryNames(directory, count);
        });
      }
      return null;
    }).catch(function () {
      return null;
    });
  }

  function entryNames(buffer, count) {
    var view = new DataView(buffer);
    var bytes = new Uint8Array(buffer);
    var decoder = new TextDecoder("utf-8");
    var names = [];
    var at = 0;
    for (var index = 0; index < count; index++) {
      if (at + 46 > buffer.byteLength || view.getUint32(at, true) !== DIRECTORY_ENTRY) return null;
      var nameLength = view.getUint16(at + 28, true);
      var extraLength = view.getUint16(at + 30, true);
      var commentLength = view.getUint16(at + 32, true);
      var name = decoder.decode(bytes.subarray(at + 46, at + 46 + nameLength));
      if (name.indexOf("\n") < 0) names.push(name);
      at += 46 + nameLength + extraLength + commentLength;
    }
    return names;
  }

  function start() {
    var form = document.getElementById("submit-form");
    if (!form) return;
    var bundle = document.getElementById("bundle");
    var status = document.getElementById("bundle-status");
    var files = document.getElementById("bundle-files");
    var button = document.getElementById("submit-button");
    var blocked = document.getElementById("submit-blocked");
    var validation = document.getElementById("validation");

    function reflectCheck() {
      var hasProblems = validation.querySelector("[data-blocking]") !== null;
      button.disabled = hasProblems;
      blocked.hidden = !hasProblems;
    }

    bundle.addEventListener("change", function () {
      var file = bundle.files && bundle.files[0];
      var again = document.getElementById("bundle-again");
      if (again) again.hidden = true;
      var listed = file ? listZip(file) : Promise.resolve(undefined);
      listed.then(function (names) {
        if (names === undefined) {
          status.value = "";
          files.value = "";
        } else if (names === null) {
          status.value = "unread";
          files.value = "";
        } else {
          status.value = "read";
          files.value = names.join("\n");
        }
        htmx.trigger(form, "bundle-listed");
      });
    });

    // A refused submission answers 400 with its problems, and one past the submission limit
    // 429 with what to do: show them where the check is.
    document.body.addEventListener("htmx:beforeSwap", function (event) {
      var status = event.detail.xhr.status;
      if (event.detail.target === validation && (status === 400 || status === 429)) {
        event.detail.shouldSwap = true;
        event.detail.isError = false;
      }
    });
    document.body.addEventListener("htmx:afterSwap", function (event) {
      if (event.detail.target === validation) reflectCheck();
    });

    // Uploading a large zip takes a while: say how far it is.
    var label = button.textContent;
    button.addEventListener("htmx:beforeRequest", function () {
      button.disabled = true;
      button.textContent = "Submitting…";
    });
    button.addEventListener("htmx:xhr:progress", function (event) {
      if (event.detail.lengthComputable && event.detail.total > 0) {
        button.textContent = "Uploading… " + Math.floor((100 * event.detail.loaded) / event.detail.total) + "%";
      }
    });
    button.addEventListener("htmx:afterRequest", function () {
      button.textContent = label;
      reflectCheck();
    });
    reflectCheck();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
