// The voice-chat demo: microphone -> input_audio_buffer.append; response audio -> gapless playback;
// live transcripts; barge-in with conversation.item.truncate. Helpers (RATE, PCM16, resampler) are in audio.js.
'use strict';
const $ = (id) => document.getElementById(id);
const ui = Object.fromEntries(
  ['talk', 'hangup', 'status', 'error', 'transcript', 'voice', 'apikey', 'mode', 'ttfa'].map((id) => [id, $(id)]));
const SEND_SAMPLES = RATE / 20; // one input_audio_buffer.append per ~50 ms of audio

let ws = null, ctx = null, mic = null, resample = null;
let ready = false, holding = false, pending = [], pendingLen = 0, heldSamples = 0;
let committedAt = null, activeResponse = null, createAfterDone = false;
// items: assistant item id -> {response, chunks: [[start time, duration]...], samples}; dropped: response ids
const play = { next: 0, sources: new Set(), items: new Map(), dropped: new Set() };
const demo = (window.demo = { events: [], errors: [], ttfa: [], truncated: [] }); // read by browser tests

const ptt = () => ui.mode.value === 'ptt';
const send = (event) => ws && ws.readyState === WebSocket.OPEN && ws.send(JSON.stringify(event));

function setState(state, text) {
  document.body.dataset.state = state;
  ui.status.textContent = text;
  const talk = ptt() ? (holding ? 'Release to send' : 'Hold to talk') : 'Hang up';
  ui.talk.textContent = state === 'connecting' ? 'Connecting…' : ws ? talk : 'Connect';
  ui.talk.classList.toggle('held', holding);
  ui.hangup.hidden = !ws;
}

function showError(text) {
  ui.error.textContent = text;
  if (text) demo.errors.push(text);
}

// -- connection ---------------------------------------------------------------------------------
async function connect() {
  showError('');
  setState('connecting', 'Starting the microphone…');
  ui.talk.disabled = true; // the permission prompt may take a while: no second connect meanwhile
  try {
    await startAudio();
  } catch (e) {
    hangup();
    return showError(`Microphone: ${e.message}`);
  } finally {
    ui.talk.disabled = false;
  }
  const key = ui.apikey.value.trim();
  const url = location.origin.replace(/^http/, 'ws') + '/v1/realtime?model=qwen3-omni';
  try {
    ws = new WebSocket(url, key ? ['realtime', 'openai-insecure-api-key.' + key] : ['realtime']);
  } catch (e) {
    hangup();
    return showError(`WebSocket: ${e.message}`);
  }
  let opened = false;
  ws.onopen = () => { opened = true; setState('connecting', 'Connected; configuring the session…'); };
  ws.onmessage = (m) => onEvent(JSON.parse(m.data));
  ws.onclose = (e) => {
    if (!opened) showError('Could not connect: is the server up, and is the API key right?');
    else if (e.code !== 1000) showError(`Connection closed (${e.code}) ${e.reason}`);
    hangup(e.reason ? `Disconnected: ${e.reason}` : 'Disconnected');
  };
  setState('connecting', 'Connecting…');
}

function hangup(text = 'Disconnected') {
  if (ws) (ws.onclose = ws.onmessage = null), ws.close(1000);
  if (mic) mic.stream.getTracks().forEach((t) => t.stop());
  stopPlayback(false);
  if (ctx) ctx.close();
  ws = ctx = mic = activeResponse = committedAt = null;
  ready = holding = createAfterDone = false;
  [pending, pendingLen] = [[], 0];
  setState('idle', text);
}

// -- microphone ---------------------------------------------------------------------------------
async function startAudio() {
  const audio = { channelCount: 1, echoCancellation: true, noiseSuppression: true };
  const stream = await navigator.mediaDevices.getUserMedia({ audio });
  mic = { stream };
  let source;
  try {
    ctx = new AudioContext({ sampleRate: RATE });
    source = ctx.createMediaStreamSource(stream);
  } catch { // a browser that refuses 24 kHz, or (Firefox) a context at another rate than the mic's: resample in JS
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

// -- push-to-talk -------------------------------------------------------------------------------
function pressTalk() {
  if (!ready || !ptt() || holding) return;
  holding = true;
  heldSamples = 0;
  if (activeResponse) send({ type: 'response.cancel' });
  stopPlayback();
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
  if (activeResponse) createAfterDone = true; // the cancelled response has not ended yet
  else send({ type: 'response.create' });
  setState('thinking', 'Thinking…');
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
  for (const [id, item] of truncate ? play.items : []) {
    const ms = playedMs(item);
    if (ms >= totalMs(item)) continue;
    send({ type: 'conversation.item.truncate', item_id: id, content_index: 0, audio_end_ms: ms });
    demo.truncated.push({ item_id: id, audio_end_ms: ms });
    play.dropped.add(item.response);
    const bubble = document.querySelector(`[data-item="${id}"]`);
    if (bubble) bubble.classList.add('interrupted');
  }
  for (const src of play.sources) src.stop();
  play.sources.clear();
  play.items.clear();
  play.next = 0;
}

// -- transcript ---------------------------------------------------------------------------------
function bubble(itemId, role) {
  let el = document.querySelector(`[data-item="${itemId}"]`);
  if (!el) {
    el = Object.assign(document.createElement('div'), { className: `turn ${role}` });
    el.dataset.item = itemId;
    ui.transcript.append(el);
  }
  ui.transcript.scrollTop = ui.transcript.scrollHeight;
  return el;
}

function firstAudio(ev) { // time to first audio: input_audio_buffer.committed -> first audio delta
  if (committedAt === null) return;
  const ms = Math.round(performance.now() - committedAt);
  committedAt = null;
  demo.ttfa.push(ms);
  ui.ttfa.textContent = `Time to first audio: ${ms} ms`;
  bubble(ev.item_id, 'assistant').dataset.ttfa = `${ms} ms`;
}

// -- server events ------------------------------------------------------------------------------
const idleText = () => (ptt() ? 'Hold the button (or Space) to talk' : 'Listening: just speak');
const dropped = (ev) => play.dropped.has(ev.response_id); // a response the user talked over

const HANDLERS = {
  'session.created': () => send(sessionUpdate(ui.voice.value, ptt())),
  'session.updated': () => { ready = true; setState('ready', idleText()); },
  'input_audio_buffer.speech_started': () => { stopPlayback(); setState('user', 'Hearing you…'); },
  'input_audio_buffer.speech_stopped': () => setState('thinking', 'Thinking…'),
  'input_audio_buffer.committed': (ev) => { committedAt = performance.now(); bubble(ev.item_id, 'user'); },
  'conversation.item.input_audio_transcription.delta': (ev) => { bubble(ev.item_id, 'user').textContent += ev.delta; },
  'conversation.item.input_audio_transcription.completed': (ev) => {
    bubble(ev.item_id, 'user').textContent = ev.transcript;
  },
  'response.created': (ev) => { activeResponse = ev.response.id; },
  'response.output_audio_transcript.delta': (ev) => {
    if (!dropped(ev)) bubble(ev.item_id, 'assistant').textContent += ev.delta;
  },
  'response.output_audio.delta': (ev) => {
    if (dropped(ev)) return;
    firstAudio(ev);
    playDelta(ev);
  },
  'response.done': (ev) => onResponseDone(ev.response),
  error: (ev) => { // (a push-to-talk cancel may race the end of the response: not worth showing)
    if (ev.error.code !== 'response_cancel_not_active') showError(`Error (${ev.error.code}): ${ev.error.message}`);
  },
};

function onEvent(ev) {
  demo.events.push(ev.type);
  if (HANDLERS[ev.type]) HANDLERS[ev.type](ev);
}

function onResponseDone(response) {
  activeResponse = null;
  const error = response.status_details && response.status_details.error;
  if (response.status === 'failed') showError(`Response failed: ${(error && error.message) || 'unknown error'}`);
  if (createAfterDone) send({ type: 'response.create' });
  else if (document.body.dataset.state !== 'user') setState('ready', idleText()); // unless the user is talking
  createAfterDone = false;
}

// -- controls -----------------------------------------------------------------------------------
ui.talk.addEventListener('click', () => (!ws ? connect() : !ptt() && hangup()));
ui.talk.addEventListener('pointerdown', (e) => {
  if (!ws || !ptt()) return;
  ui.talk.setPointerCapture(e.pointerId);
  pressTalk();
});
ui.talk.addEventListener('pointerup', releaseTalk);
ui.talk.addEventListener('pointercancel', releaseTalk);
ui.hangup.addEventListener('click', () => hangup());
ui.voice.addEventListener('change', () => ready && send(sessionUpdate(ui.voice.value, ptt())));
ui.mode.addEventListener('change', () => {
  if (!ready) return setState(document.body.dataset.state, ui.status.textContent);
  if (ptt()) send({ type: 'input_audio_buffer.clear' }); // drop half a turn the VAD was collecting
  releaseTalk();
  send(sessionUpdate(ui.voice.value, ptt()));
});
const onSpace = (e) => { // Space works as the push-to-talk button, except while typing in a field
  if (e.code !== 'Space' || !ws || !ptt() || ['INPUT', 'SELECT'].includes(e.target.tagName)) return;
  e.preventDefault();
  if (e.type === 'keyup') releaseTalk();
  else if (!e.repeat) pressTalk();
};
document.addEventListener('keydown', onSpace);
document.addEventListener('keyup', onSpace);
setState('idle', 'Disconnected');
