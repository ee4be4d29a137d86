// Warren console: the only script of its own, and only an enhancement. A
// running execution's page follows its output over server-sent events and
// reloads once it ends; without script the page reloads itself every 2 s
// instead. Output is added as text nodes, never as markup. A terminal page
// (xterm.js, loaded before this) carries its shell over the console's
// WebSocket: keystrokes as binary frames, a resize as a JSON text frame.
(function () {
  'use strict';
  var box = document.querySelector('#terminal[data-ws]');
  if (!box || !window.Terminal || !window.WebSocket) return;
  var term = new window.Terminal({ rows: 24, cols: 80, convertEol: false });
  term.open(box);
  var url = (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + box.getAttribute('data-ws');
  var ws = new WebSocket(url);
  ws.binaryType = 'arraybuffer';
  var enc = new TextEncoder();
  ws.onmessage = function (m) {
    if (m.data instanceof ArrayBuffer) term.write(new Uint8Array(m.data));
  };
  ws.onclose = function (e) {
    term.write('\r\n[' + (e.reason || 'the session ended') + ']\r\n');
    box.setAttribute('data-closed', e.reason || 'closed');
  };
  term.onData(function (d) {
    if (ws.readyState === 1) ws.send(enc.encode(d));
  });
  term.onResize(function (s) {
    if (ws.readyState === 1) ws.send(JSON.stringify({ resize: [s.rows, s.cols] }));
  });
  term.focus();
})();
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
