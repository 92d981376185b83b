# Smart Turn v3.2 scored the Python way (numpy Whisper features, onnxruntime), on the windows
# `score_stops` prints as "history" and "turn+0.2", to check the Rust inference against:
#   python3 -m venv /tmp/st && /tmp/st/bin/pip install numpy onnxruntime
#   /tmp/st/bin/python turn-detect/examples/smart_turn_reference.py $SUBLET_MODELS CALL.wav
import sys, json, wave, numpy as np, onnxruntime as ort
models = sys.argv[1]; wav = sys.argv[2]
w = wave.open(wav); n = w.getnframes(); rate = w.getframerate()
raw = w.readframes(n)
a = np.frombuffer(raw, dtype=np.int16).astype(np.float32) / 32768.0 if w.getsampwidth() == 2 else np.frombuffer(raw, dtype=np.float32)
assert rate == 16000, rate
filters = np.load(models + "/stt/mel_filters.npz")["mel_80"]
sess = ort.InferenceSession(models + "/turn/smart-turn-v3.2-cpu.onnx")
def features(x):
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    pad = 200
    xp = np.pad(x, (pad, pad), mode="reflect")
    win = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)
    frames = 1 + (len(xp) - 400) // 160
    idx = np.arange(400)[None, :] + 160 * np.arange(frames)[:, None]
    spec = np.abs(np.fft.rfft(xp[idx] * win, axis=1)) ** 2
    mel = filters @ spec.T  # 80 x frames
    logm = np.log10(np.maximum(mel, 1e-10))[:, :-1]
    logm = np.maximum(logm, logm.max() - 8.0)
    return ((logm + 4.0) / 4.0).astype(np.float32)
def score(seg):
    seg = seg[-128000:]
    seg = np.pad(seg, (128000 - len(seg), 0))
    return float(sess.run(None, {"input_features": features(seg)[None]})[0].reshape(-1)[0])
at = lambda s: min(len(a), int(max(s, 0) * 16000))
for turn in json.load(open(wav[:-4] + ".json")):
    stops = [(p[0], "pause") for p in turn["pauses"]] + [(turn["end_s"], "end")]
    for stop, kind in stops:
        h = score(a[at(stop + 0.4 - 8):at(stop + 0.4)])
        t2 = score(a[at(turn["start_s"] - 0.5):at(stop + 0.2)])
        print(f"{kind:<7} {stop:7.2f} {h:9.3f} {t2:9.3f}  {turn['text']}")
