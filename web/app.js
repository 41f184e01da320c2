// The voice-chat demo: microphone -> input_audio_buffer.append; response audio -> gapless playback;
// live transcripts; text messages; barge-in with conversation.item.truncate; reconnect with backoff.
// Helpers (RATE, PCM16, resampler, sessionUpdate, median, backoffMs) are in audio.js.
'use strict';
const $ = (id) => document.getElementById(id);
const ui = Object.fromEntries([
  'settings', 'call', 'talk', 'status', 'error', 'notice', 'transcript', 'voice', 'apikey', 'remember', 'mode', 'ttfa',
  'instructions', 'threshold', 'threshold-value', 'prefix', 'silence', 'vad-settings', 'level', 'speaking',
  'events', 'log-count', 'composer', 'message', 'send', 'model-id', 'transcribe', 'log',
].map((id) => [id, $(id)]));
const SEND_SAMPLES = RATE / 20; // one input_audio_buffer.append per ~50 ms of audio
const KEY_STORE = 'omni-realtime.api-key';
const MAX_LOG_ROWS = 400;
const secure = window.isSecureContext && !!(navigator.mediaDevices && navigator.mediaDevices.getUserMedia);

let ws = null, ctx = null, mic = null, resample = null;
let wanted = false, attempt = 0, reconnectTimer = null, t0 = null;
let ready = false, holding = false, pending = [], pendingLen = 0, heldSamples = 0;
let turnStart = null, activeResponse = null, createAfterDone = false;
let served = null; // the served model: {id, capabilities} from /v1/models (null until the server answers)
// items: assistant item id -> {response, chunks: [[start time, duration]...], samples}; dropped: response ids
const play = { next: 0, sources: new Set(), items: new Map(), dropped: new Set() };
// read by the browser tests
const demo = (window.demo = { events: [], sent: [], errors: [], ttfa: [], truncated: [], cut: [], levelMax: 0,
                              outputActive: false, connects: 0 });

const ptt = () => ui.mode.value === 'ptt';
const touch = matchMedia('(pointer: coarse)').matches;
const phone = () => matchMedia('(max-width: 899px)').matches;
// a number field shows exactly what is sent: the value is put on its min/max/step grid when it changes
const numberOf = (el, fallback) => fieldNumber(el.value, { min: Number(el.min), max: Number(el.max),
                                                           step: Number(el.step) }, fallback);
const settings = () => ({
  voice: ui.voice.value, pushToTalk: ptt(), instructions: ui.instructions.value.trim(), model: served,
  threshold: Number(ui.threshold.value), prefixPaddingMs: numberOf(ui.prefix, 300),
  silenceMs: numberOf(ui.silence, 500), transcribe: ui.transcribe.checked,
});

function send(event) {
  if (!ws || ws.readyState !== WebSocket.OPEN) return false;
  ws.send(JSON.stringify(event));
  demo.sent.push(event.type);
  logEvent('client', event.type);
  return true;
}

function setState(state, text) {
  document.body.dataset.state = state;
  ui.status.textContent = text;
  const live = wanted || ws;
  ui.call.textContent = !live ? 'Connect' : 'Hang up';
  ui.call.classList.toggle('live', !!live);
  ui.talk.hidden = !(ready && ptt() && mic);
  ui.talk.textContent = holding ? 'Release to send' : 'Hold to talk';
  ui.talk.classList.toggle('held', holding);
  ui.message.disabled = ui.send.disabled = !ready;
  ui.transcript.dataset.hint = !live ? 'Connect, then speak or type a message. The conversation appears here.'
    : !ready ? 'Connecting…' : mic ? 'Speak or type a message.' : 'Type a message.';
  ui['vad-settings'].disabled = ptt();
}

function showError(text) {
  ui.error.textContent = text;
  if (text) demo.errors.push(text);
}

// -- event log ----------------------------------------------------------------------------------
const streaming = (type) => type.endsWith('.delta') || type === 'input_audio_buffer.append';

function logEvent(dir, type) {
  const ms = Math.round(performance.now() - (t0 ?? performance.now()));
  let same = null; // streams of deltas and appends (interleaved with each other) fold into one row each
  for (let r = ui.events.lastElementChild, n = 0; streaming(type) && r && streaming(r.dataset.type) && n < 6;
    r = r.previousElementSibling, n++) {
    if (r.dataset.dir === dir && r.dataset.type === type) { same = r; break; }
  }
  if (same) {
    same.dataset.count = Number(same.dataset.count) + 1;
    same.querySelector('.n').textContent = `×${same.dataset.count}`;
    same.title = `last at ${(ms / 1000).toFixed(3)} s`;
    return;
  }
  const row = document.createElement('li');
  Object.assign(row.dataset, { dir, type, count: 1 });
  row.innerHTML = `<time></time><span class="dir"></span><code></code><span class="n"></span>`;
  row.querySelector('time').textContent = `${(ms / 1000).toFixed(3)} s`;
  row.querySelector('.dir').textContent = dir === 'client' ? '↑' : '↓';
  row.querySelector('.dir').title = dir === 'client' ? 'client → server' : 'server → client';
  row.querySelector('code').textContent = type;
  const follow = ui.events.scrollTop + ui.events.clientHeight >= ui.events.scrollHeight - 4;
  ui.events.append(row);
  while (ui.events.children.length > MAX_LOG_ROWS) ui.events.firstElementChild.remove();
  if (follow) ui.events.scrollTop = ui.events.scrollHeight;
  ui['log-count'].textContent = `(${demo.events.length + demo.sent.length})`;
}

// -- the served model -----------------------------------------------------------------------------
async function loadModel() { // its id and voices, from /v1/models (with the key, if the server wants one)
  const key = ui.apikey.value.trim();
  try {
    const r = await fetch('/v1/models', { cache: 'no-store', headers: key ? { Authorization: `Bearer ${key}` } : {} });
    if (!r.ok) return;
    served = (await r.json()).data[0];
  } catch {
    return;
  }
  const caps = served.capabilities, chosen = ui.voice.value;
  ui['model-id'].textContent = served.id;
  ui.voice.replaceChildren(...caps.voices.map((v) => new Option(v[0].toUpperCase() + v.slice(1), v)));
  ui.voice.value = caps.voices.includes(chosen) ? chosen : caps.default_voice;
  ui.voice.disabled = !caps.audio_out;
  document.dispatchEvent(new CustomEvent('served', { detail: served }));
}

// -- connection ---------------------------------------------------------------------------------
async function connect() {
  wanted = true;
  attempt = 0;
  t0 = t0 ?? performance.now();
  if (phone()) ui.settings.open = false; // the conversation gets the screen
  showError('');
  setState('connecting', secure ? 'Starting the microphone…' : 'Connecting (text only: no microphone here)…');
  ui.call.disabled = true; // the permission prompt may take a while: no second connect meanwhile
  try {
    await startAudio();
  } catch (e) {
    hangup();
    return showError(`Microphone: ${e.message}`);
  } finally {
    ui.call.disabled = false;
  }
  await loadModel();
  openSocket();
}

function openSocket() {
  reconnectTimer = null;
  const key = ui.apikey.value.trim();
  rememberKey();
  const url = location.origin.replace(/^http/, 'ws') + '/v1/realtime' + (served ? `?model=${encodeURIComponent(served.id)}` : '');
  let sock;
  try {
    sock = ws = new WebSocket(url, key ? ['realtime', 'openai-insecure-api-key.' + key] : ['realtime']);
  } catch (e) {
    hangup();
    return showError(`WebSocket: ${e.message}`);
  }
  let opened = false;
  sock.onopen = () => {
    opened = true;
    demo.connects += 1;
    setState('connecting', 'Connected; configuring the session…');
  };
  sock.onmessage = (m) => onEvent(JSON.parse(m.data));
  sock.onclose = (e) => { if (sock === ws) onClosed(e, opened, key); };
  setState(attempt ? 'reconnecting' : 'connecting', attempt ? `Reconnecting (attempt ${attempt + 1})…` : 'Connecting…');
}

async function onClosed(e, opened, key) {
  ws = null;
  ready = holding = createAfterDone = false;
  activeResponse = turnStart = null;
  stopPlayback(false);
  if (!wanted) return;
  let status = 0;
  if (!opened) { // the handshake failed: only a 401 for the same key over HTTP means the key is at fault
    // (a server that was down and is up again answers by now: that is a retry, not a refusal)
    const headers = key ? { Authorization: `Bearer ${key}` } : {};
    status = await fetch('/v1/models', { cache: 'no-store', headers }).then((r) => r.status, () => 0);
    if (!wanted) return;
    if (status === 401) {
      hangup('Not connected');
      return showError(key ? 'The server refused the API key: check it, then connect again.'
        : 'The server requires an API key: enter it, then connect again.');
    }
  } else if (e.code === 1000 && e.reason) { // the server ended the session on purpose (e.g. it expired)
    hangup(`Disconnected: ${e.reason}`);
    return;
  }
  const delay = backoffMs(attempt++);
  const why = opened ? `connection closed${e.reason ? ` (${e.reason})` : ''}`
    : status ? 'the connection failed' : 'server unreachable';
  setState('reconnecting', `${why[0].toUpperCase()}${why.slice(1)}; reconnecting in ${(delay / 1000).toFixed(1)} s…`);
  reconnectTimer = setTimeout(openSocket, delay);
}

function hangup(text = 'Disconnected') {
  wanted = false;
  clearTimeout(reconnectTimer);
  reconnectTimer = null;
  const sock = ws;
  ws = null;
  if (sock) (sock.onclose = sock.onmessage = null), sock.close(1000);
  if (mic) mic.stream.getTracks().forEach((t) => t.stop());
  stopPlayback(false);
  if (ctx) ctx.close();
  ctx = mic = activeResponse = turnStart = null;
  ready = holding = createAfterDone = false;
  [pending, pendingLen] = [[], 0];
  ui.level.value = 0;
  setState('idle', text);
}

function rememberKey() {
  if (ui.remember.checked && ui.apikey.value.trim()) localStorage.setItem(KEY_STORE, ui.apikey.value.trim());
  else localStorage.removeItem(KEY_STORE);
}

// -- microphone ---------------------------------------------------------------------------------
function newContext() {
  try {
    return new AudioContext({ sampleRate: RATE });
  } catch { // a browser that refuses 24 kHz: resample in JS
    return new AudioContext();
  }
}

async function startAudio() {
  if (!secure) { // no getUserMedia or AudioWorklet here: playback only
    ctx = newContext();
    return ctx.resume();
  }
  const audio = { channelCount: 1, echoCancellation: true, noiseSuppression: true };
  const stream = await navigator.mediaDevices.getUserMedia({ audio });
  mic = { stream };
  let source;
  try {
    ctx = newContext();
    source = ctx.createMediaStreamSource(stream);
  } catch { // (Firefox) a context at another rate than the mic's
    if (ctx) ctx.close();
    ctx = new AudioContext();
    source = ctx.createMediaStreamSource(stream);
  }
  resample = makeResampler(ctx.sampleRate, RATE);
  await ctx.audioWorklet.addModule('/static/mic-worklet.js');
  const node = new AudioWorkletNode(ctx, 'mic-capture');
  node.port.onmessage = (e) => onMic(e.data);
  source.connect(node).connect(ctx.destination); // the worklet outputs silence; the link keeps it pulled
  await ctx.resume();
}

function onMic(frame) {
  let sum = 0;
  for (const x of frame) sum += x * x;
  const db = 10 * Math.log10(sum / frame.length + 1e-12); // -60 dBFS .. 0 dBFS -> 0 .. 1
  const level = Math.min(1, Math.max(0, (db + 60) / 60));
  ui.level.value = level;
  demo.levelMax = Math.max(demo.levelMax, level);
  if (!ready || !(holding || !ptt())) return;
  const x = resample(frame);
  pending.push(x);
  pendingLen += x.length;
  if (pendingLen >= SEND_SAMPLES) flushMic();
}

function flushMic() {
  if (!pendingLen) return;
  const all = new Float32Array(pendingLen);
  let at = 0;
  for (const p of pending) { all.set(p, at); at += p.length; }
  [pending, pendingLen] = [[], 0];
  heldSamples += all.length;
  send({ type: 'input_audio_buffer.append', audio: floatToPcm16Base64(all) });
}

// -- push-to-talk and text messages -------------------------------------------------------------
function interrupt() { // the user takes the turn: stop the reply, both here and on the server
  if (activeResponse) send({ type: 'response.cancel' });
  stopPlayback();
}

function pressTalk() {
  if (!ready || !ptt() || holding) return;
  holding = true;
  heldSamples = 0;
  interrupt();
  setState('user', 'Listening… release to send');
}

function releaseTalk() {
  if (!holding) return;
  holding = false;
  flushMic();
  if (heldSamples < RATE / 10) { // the server needs at least 100 ms in a commit
    send({ type: 'input_audio_buffer.clear' });
    return setState('ready', 'Too short: hold the button while you speak');
  }
  send({ type: 'input_audio_buffer.commit' });
  respond();
}

function respond() {
  if (activeResponse) createAfterDone = true; // the cancelled response has not ended yet
  else send({ type: 'response.create' });
  setState('thinking', 'Thinking…');
}

function sendMessage(text) {
  if (!ready || !text) return;
  interrupt();
  send({ type: 'conversation.item.create',
         item: { type: 'message', role: 'user', content: [{ type: 'input_text', text }] } });
  turnStart = performance.now();
  respond();
}

// -- playback and barge-in ----------------------------------------------------------------------
const totalMs = (item) => Math.floor((item.samples * 1000) / RATE);

function playedMs(item) {
  const now = ctx.currentTime - (ctx.outputLatency || 0);
  const s = item.chunks.reduce((sum, [at, dur]) => sum + Math.min(Math.max(now - at, 0), dur), 0);
  return Math.min(Math.floor(s * 1000), totalMs(item));
}

function playDelta(ev) {
  if (!ctx) return;
  const pcm = base64ToFloat(ev.delta);
  if (!pcm.length) return;
  let item = play.items.get(ev.item_id);
  if (!item) {
    for (const [id, old] of play.items) if (playedMs(old) >= totalMs(old)) play.items.delete(id);
    play.items.set(ev.item_id, (item = { response: ev.response_id, chunks: [], samples: 0 }));
  }
  const buf = new AudioBuffer({ length: pcm.length, sampleRate: RATE });
  buf.copyToChannel(pcm, 0);
  const src = new AudioBufferSourceNode(ctx, { buffer: buf });
  src.connect(ctx.destination);
  const at = Math.max(play.next, ctx.currentTime + 0.03); // a little lead after a gap, none while streaming
  src.start(at);
  play.next = at + buf.duration;
  play.sources.add(src);
  src.onended = () => play.sources.delete(src);
  item.chunks.push([at, buf.duration]);
  item.samples += pcm.length;
  setState('assistant', 'Assistant speaking…');
}

// Stop everything scheduled; tell the server how much of each unfinished item was actually heard.
function stopPlayback(truncate = true) {
  if (activeResponse) play.dropped.add(activeResponse);
  for (const [id, item] of truncate && ctx ? play.items : []) {
    const ms = playedMs(item);
    if (ms >= totalMs(item)) continue;
    send({ type: 'conversation.item.truncate', item_id: id, content_index: 0, audio_end_ms: ms });
    demo.truncated.push({ item_id: id, audio_end_ms: ms });
    play.dropped.add(item.response);
    const el = document.querySelector(`[data-item="${id}"]`);
    if (el) keepInView(() => el.classList.add('interrupted'));
  }
  for (const src of play.sources) src.stop();
  play.sources.clear();
  play.items.clear();
  play.next = 0;
}

setInterval(() => { // the output activity light: on while scheduled audio is still to play
  const active = !!ctx && ctx.currentTime < play.next;
  ui.speaking.dataset.active = String(active);
  demo.outputActive ||= active;
}, 100);

// -- transcript ---------------------------------------------------------------------------------
const atBottom = () => { const t = ui.transcript; return t.scrollTop + t.clientHeight >= t.scrollHeight - 40; };

function keepInView(change) { // the newest line stays in view as messages grow, unless the user scrolled up to read
  const follow = atBottom();
  const out = change();
  if (follow) ui.transcript.scrollTop = ui.transcript.scrollHeight;
  return out;
}

function bubble(itemId, role) {
  let el = document.querySelector(`[data-item="${itemId}"]`);
  if (!el) {
    el = Object.assign(document.createElement('article'), { className: `turn ${role}` });
    el.dataset.item = itemId;
    el.innerHTML = '<h2 class="who"></h2><p class="text"></p>';
    el.querySelector('.who').textContent = role === 'user' ? 'You' : 'Assistant';
    keepInView(() => ui.transcript.append(el));
  }
  return el;
}

function setText(itemId, role, text, append = false) {
  const p = bubble(itemId, role).querySelector('.text');
  keepInView(() => { p.textContent = append ? p.textContent + text : text; });
}

function firstAudio(ev) { // time to first audio: end of the user's turn -> first audio delta
  if (turnStart === null) return;
  const ms = Math.round(performance.now() - turnStart);
  turnStart = null;
  demo.ttfa.push(ms);
  const n = demo.ttfa.length;
  ui.ttfa.textContent = `first audio ${ms} ms · median ${median(demo.ttfa)} ms (${n} turn${n > 1 ? 's' : ''})`;
  const el = bubble(ev.item_id, 'assistant');
  keepInView(() => { el.dataset.ttfa = `${ms} ms`; });
}

// -- server events ------------------------------------------------------------------------------
const idleText = () => (!mic ? 'Ready: type a message' : !ptt() ? 'Listening: just speak'
  : touch ? 'Hold the button to talk' : 'Hold the button (or Space) to talk');
const dropped = (ev) => play.dropped.has(ev.response_id); // a response the user talked over
const contentText = (item) => (item.content || []).map((c) => c.text ?? c.transcript ?? '').join('');

const HANDLERS = {
  'session.created': () => send(sessionUpdate(settings())),
  'session.updated': () => { ready = true; if (!activeResponse) setState('ready', idleText()); },
  // the server cancels its response itself (interrupt_response): the page stops playback and truncates
  'input_audio_buffer.speech_started': () => { stopPlayback(); setState('user', 'Hearing you…'); },
  'input_audio_buffer.speech_stopped': () => setState('thinking', 'Thinking…'),
  'input_audio_buffer.committed': (ev) => { turnStart = performance.now(); bubble(ev.item_id, 'user'); },
  'conversation.item.added': (ev) => {
    const item = ev.item;
    if (item.role === 'user' && item.content.some((c) => c.type === 'input_text')) {
      setText(item.id, 'user', contentText(item));
    }
  },
  'conversation.item.input_audio_transcription.delta': (ev) => setText(ev.item_id, 'user', ev.delta, true),
  'conversation.item.input_audio_transcription.completed': (ev) => setText(ev.item_id, 'user', ev.transcript),
  'conversation.item.truncated': (ev) => send({ type: 'conversation.item.retrieve', item_id: ev.item_id }),
  'conversation.item.retrieved': (ev) => { // after a truncate: the transcript cut to what was heard
    const el = document.querySelector(`[data-item="${ev.item.id}"]`);
    if (!el || ev.item.role !== 'assistant') return;
    setText(ev.item.id, 'assistant', contentText(ev.item));
    demo.cut.push({ item_id: ev.item.id, text: contentText(ev.item) });
  },
  'response.created': (ev) => { activeResponse = ev.response.id; },
  'response.output_audio_transcript.delta': (ev) => { if (!dropped(ev)) setText(ev.item_id, 'assistant', ev.delta, true); },
  'response.output_text.delta': (ev) => { if (!dropped(ev)) setText(ev.item_id, 'assistant', ev.delta, true); },
  'response.output_audio.delta': (ev) => {
    if (dropped(ev)) return;
    firstAudio(ev);
    playDelta(ev);
  },
  'response.done': (ev) => onResponseDone(ev.response),
  error: (ev) => { // (a cancel may race the end of the response: not worth showing)
    if (ev.error.code !== 'response_cancel_not_active') showError(`Error (${ev.error.code}): ${ev.error.message}`);
  },
};

function onEvent(ev) {
  demo.events.push(ev.type);
  logEvent('server', ev.type);
  if (HANDLERS[ev.type]) HANDLERS[ev.type](ev);
}

function markEnded(response) { // a reply that did not run to its end says so under its bubble
  const reason = response.status_details && response.status_details.reason;
  const why = response.status === 'incomplete' ? `incomplete: cut off (${reason || 'limit'})`
    : response.status === 'failed' ? 'failed' : null;
  for (const item of why ? response.output || [] : []) {
    const el = document.querySelector(`[data-item="${item.id}"]`);
    if (el && !el.classList.contains('interrupted')) {
      keepInView(() => { el.classList.add('incomplete'); el.dataset.ended = why; });
    }
  }
}

function onResponseDone(response) {
  activeResponse = null;
  markEnded(response);
  const error = response.status_details && response.status_details.error;
  if (response.status === 'failed') showError(`Response failed: ${(error && error.message) || 'unknown error'}`);
  if (createAfterDone) send({ type: 'response.create' });
  else if (document.body.dataset.state !== 'user') setState('ready', idleText()); // unless the user is talking
  createAfterDone = false;
}

// -- controls -----------------------------------------------------------------------------------
const update = () => ready && send(sessionUpdate(settings()));
ui.call.addEventListener('click', () => (wanted || ws ? hangup() : connect()));
ui.talk.addEventListener('pointerdown', (e) => {
  ui.talk.setPointerCapture(e.pointerId);
  pressTalk();
});
ui.talk.addEventListener('pointerup', releaseTalk);
ui.talk.addEventListener('pointercancel', releaseTalk);
ui.composer.addEventListener('submit', (e) => {
  e.preventDefault();
  sendMessage(ui.message.value.trim());
  ui.message.value = '';
});
ui.threshold.addEventListener('input', () => { ui['threshold-value'].textContent = Number(ui.threshold.value).toFixed(2); });
for (const [el, fallback] of [[ui.prefix, 300], [ui.silence, 500]]) {
  el.addEventListener('change', () => { el.value = numberOf(el, fallback); });
}
for (const el of [ui.voice, ui.threshold, ui.prefix, ui.silence, ui.instructions, ui.transcribe]) {
  el.addEventListener('change', update);
}
for (const [a, b] of [[ui.settings, ui.log], [ui.log, ui.settings]]) { // a phone shows one panel at a time
  a.addEventListener('toggle', () => { if (a.open && phone()) b.open = false; });
}
ui.mode.addEventListener('change', () => {
  if (!ready) return setState(document.body.dataset.state, ui.status.textContent);
  if (ptt()) send({ type: 'input_audio_buffer.clear' }); // drop half a turn the VAD was collecting
  releaseTalk();
  update();
  setState('ready', idleText());
});
ui.remember.addEventListener('change', rememberKey);
ui.apikey.addEventListener('change', () => { if (!served) loadModel(); });
const onSpace = (e) => { // Space works as the push-to-talk button, except while typing in a field
  if (e.code !== 'Space' || !ready || !ptt() || ['INPUT', 'SELECT', 'TEXTAREA'].includes(e.target.tagName)) return;
  e.preventDefault();
  if (e.type === 'keyup') releaseTalk();
  else if (!e.repeat) pressTalk();
};
document.addEventListener('keydown', onSpace);
document.addEventListener('keyup', onSpace);

const stored = localStorage.getItem(KEY_STORE);
if (stored) [ui.apikey.value, ui.remember.checked] = [stored, true];
if (!secure) {
  ui.notice.hidden = false;
  ui.notice.textContent = 'The microphone needs HTTPS or localhost: this page came over plain HTTP from '
    + `${location.hostname}, so the browser keeps the microphone off. Text messages still work. `
    + 'To talk, open it as http://localhost:… on the server machine, or serve HTTPS '
    + '(omni-realtime serve --ssl-certfile … --ssl-keyfile …).';
}
if (phone()) ui.settings.open = false; // a phone: the chat first
setState('idle', 'Disconnected');
loadModel();
