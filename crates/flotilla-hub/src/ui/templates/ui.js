// Refreshes the page when the fleet changes: a small JSON request every five
// seconds; the page is reloaded only when its stamp differs and nobody is typing.
(function () {
  var stamp = document.body.getAttribute("data-stamp");
  if (!stamp) { return; }
  function look() {
    fetch("/ui/fleet.json", { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { if (r.redirected || !r.ok) { throw r; } return r.json(); })
      .then(function (fleet) {
        var typing = document.activeElement && /INPUT|SELECT|TEXTAREA/.test(document.activeElement.tagName);
        if (fleet.stamp !== stamp && !typing) { window.location.reload(); }
      })
      .catch(function () {});
  }
  setInterval(look, 5000);
})();
