// Pure helpers for the demo: PCM16 <-> base64, a streaming resampler, the session.update event, median, backoff.
// A classic script (no DOM), so the browser loads it before app.js and Node can require() it in tests.
'use strict';
const RATE = 24000; // the Realtime protocol's audio/pcm rate, both directions

function floatToPcm16Base64(samples) {
  const view = new DataView(new ArrayBuffer(samples.length * 2));
  for (let i = 0; i < samples.length; i++) {
    view.setInt16(2 * i, Math.round(Math.max(-1, Math.min(1, samples[i])) * 32767), true); // little-endian
  }
  const bytes = new Uint8Array(view.buffer);
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

function base64ToFloat(b64) {
  const bin = atob(b64);
  const out = new Float32Array(bin.length >> 1);
  for (let i = 0; i < out.length; i++) {
    const v = bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8);
    out[i] = (v >= 0x8000 ? v - 0x10000 : v) / 32768;
  }
  return out;
}

// Linear-interpolation resampler that keeps its phase and last sample across chunks.
function makeResampler(from, to) {
  if (from === to) return (x) => x;
  const step = from / to;
  let t = 0, prev = 0; // t: the next output sample's position in the coming chunk (-1: `prev`, the last one before)
  return (x) => {
    const out = [];
    for (; t < x.length - 1; t += step) {
      const i = Math.floor(t), a = i < 0 ? prev : x[i];
      out.push(a + (x[i + 1] - a) * (t - i));
    }
    t -= x.length;
    if (x.length) prev = x[x.length - 1];
    return Float32Array.from(out);
  };
}

// settings: {voice, pushToTalk, instructions, threshold, prefixPaddingMs, silenceMs, transcribe} (the page's
// controls) and model: the served model from /v1/models ({id, capabilities}), or null when the server did not say
function sessionUpdate(settings) {
  const format = { type: 'audio/pcm', rate: RATE };
  const caps = settings.model ? settings.model.capabilities : { audio_out: true, transcription: true };
  const turnDetection = settings.pushToTalk ? null : {
    type: 'server_vad', threshold: settings.threshold, prefix_padding_ms: settings.prefixPaddingMs,
    silence_duration_ms: settings.silenceMs,
  };
  const transcribe = settings.transcribe && caps.transcription; // costs a model pass per turn
  const transcription = transcribe ? { model: settings.model ? settings.model.id : null } : null;
  const output = { format };
  if (caps.audio_out && settings.voice) output.voice = settings.voice;
  const session = { type: 'realtime', instructions: settings.instructions,
                    output_modalities: [caps.audio_out ? 'audio' : 'text'],
                    audio: { input: { format, turn_detection: turnDetection, transcription }, output } };
  return { type: 'session.update', session };
}

function median(xs) {
  if (!xs.length) return null;
  const s = [...xs].sort((a, b) => a - b), m = s.length >> 1;
  return s.length % 2 ? s[m] : Math.round((s[m - 1] + s[m]) / 2);
}

// A number field's value as it will be sent: within [min, max], on the step grid from min; `fallback` if empty.
function fieldNumber(text, { min, max, step }, fallback) {
  const x = Number(text);
  if (text === '' || !Number.isFinite(x)) return fallback;
  const on = Math.round((Math.min(max, Math.max(min, x)) - min) / step) * step + min;
  return Math.min(max, on);
}

// Reconnect delays: 0.5 s, 1, 2, 4, then 8 s at most.
const backoffMs = (attempt) => Math.min(500 * 2 ** attempt, 8000);

if (typeof module !== 'undefined') {
  module.exports = { RATE, floatToPcm16Base64, base64ToFloat, makeResampler, sessionUpdate, median, backoffMs,
                     fieldNumber };
}
