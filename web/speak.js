// "Read aloud": when the served model reads text aloud (capabilities.speech), typed text is spoken through
// POST /v1/audio/speech in the voice chosen above, and played in the page. The model comes from app.js ('served').
'use strict';
(() => {
  const el = (id) => document.getElementById(id);
  const box = el('read-aloud'), text = el('speak-text'), button = el('speak'), status = el('speak-status');
  const player = el('speak-audio');
  let model = null, url = null;
  const spoken = (window.demo.spoken = []); // read by the browser tests: {bytes, type} per reply

  document.addEventListener('served', (e) => {
    model = e.detail;
    box.hidden = !model.capabilities.speech;
  });

  async function speak() {
    const input = text.value.trim();
    if (!model || !input) return;
    const key = el('apikey').value.trim();
    button.disabled = true;
    status.textContent = 'Speaking…';
    try {
      const r = await fetch('/v1/audio/speech', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', ...(key ? { Authorization: `Bearer ${key}` } : {}) },
        body: JSON.stringify({ model: model.id, input, voice: el('voice').value, response_format: 'wav' }),
      });
      if (!r.ok) {
        const body = await r.json().catch(() => ({}));
        throw new Error(body.error?.message || `HTTP ${r.status}`);
      }
      const blob = await r.blob();
      spoken.push({ bytes: blob.size, type: blob.type });
      if (url) URL.revokeObjectURL(url);
      url = URL.createObjectURL(blob);
      player.src = url;
      player.hidden = false;
      status.textContent = '';
      await player.play().catch(() => {}); // a browser that blocks autoplay leaves the controls to the user
    } catch (err) {
      status.textContent = `Could not speak: ${err.message}`;
    } finally {
      button.disabled = false;
    }
  }

  button.addEventListener('click', speak);
})();
