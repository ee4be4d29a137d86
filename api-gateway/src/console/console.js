// Warren console: the only script, and only an enhancement. A running
// execution's page follows its output over server-sent events and reloads
// once it ends; without script the page reloads itself every 2 s instead.
// Output is added as text nodes, never as markup.
(function () {
  'use strict';
  var out = document.querySelector('pre.live[data-events]');
  if (!out || !window.EventSource) return;
  var err = document.querySelector('pre.live-err');
  var events = new EventSource(out.getAttribute('data-events'));
  events.onmessage = function (m) {
    var ev;
    try { ev = JSON.parse(m.data); } catch (e) { return; }
    if (!ev || ev.type !== 'output' || typeof ev.data !== 'string') return;
    var target = ev.stream === 'stderr' && err ? err : out;
    target.appendChild(document.createTextNode(ev.data));
  };
  events.addEventListener('end', function () {
    events.close();
    window.location.reload();
  });
})();
