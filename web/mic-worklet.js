// AudioWorklet: hands the microphone's mono Float32 samples to the main thread in blocks of 512.
class MicCapture extends AudioWorkletProcessor {
  constructor() {
    super();
    [this.block, this.n] = [new Float32Array(512), 0];
  }

  process(inputs) {
    const samples = (inputs[0] && inputs[0][0]) || [];
    for (const x of samples) {
      this.block[this.n++] = x;
      if (this.n < this.block.length) continue;
      this.port.postMessage(this.block, [this.block.buffer]);
      [this.block, this.n] = [new Float32Array(512), 0];
    }
    return true;
  }
}

registerProcessor('mic-capture', MicCapture);
