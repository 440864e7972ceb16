# Shared by the resume-across-layouts scripts (sourced): the corpus, a tiny
# training config, and the loss comparison.

# prepare_fortunes DIR: the fortunes corpus tokenized with GPT-2 into DIR.
prepare_fortunes() {
  "$bin" prepare --force --tokenizer gpt2 --input /usr/share/games/fortunes --doc-split percent \
    --val-fraction 0.05 --output "$1" > /dev/null 2>&1
}

# gpu_test_setup SOURCE_DIR TMP: for the GPU scripts (tests/cuda/*.sh): exits
# 77 (skipped, saying why) without a GPU; sets `data` to the demo corpus
# (carried to the GPU machine) or prepares it into TMP/data.
gpu_test_setup() {
  local devices
  devices=$("$bin" devices)
  grep -q "cuda:0 " <<< "$devices" || { echo "SKIP: no GPU ($(tail -1 <<< "$devices"))"; exit 77; }
  data="$1/data/fortunes-gpt2"
  if [ ! -f "$data/index.json" ]; then
    [ -d /usr/share/games/fortunes ] || { echo "SKIP: no corpus ($data, or /usr/share/games/fortunes to prepare)"; exit 77; }
    data="$2/data"
    prepare_fortunes "$data"
  fi
}

# write_config FILE PRESET DATA_DIR: 10 steps of a tiny model, a checkpoint every 2 steps, all kept.
write_config() {
  cat > "$1" <<TOML
[model]
preset = "$2"
vocab_size = 50257
[data]
dir = "$3"
tokenizer = ""
[train]
seq_len = 32
global_batch = 8
micro_batch = 2
steps = 10
log_every = 100
[optim]
lr = 3e-3
warmup_steps = 2
[sample]
count = 0
[metrics]
peak_gflops = 1
[checkpoint]
every = 2
keep_last = 0
TOML
}

# losses RUN_DIR: the per-step losses of metrics.jsonl, space-separated.
losses() { /usr/bin/python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if '\"loss\"' in l))" "$1/metrics.jsonl"; }

# same REF GOT [TOLERANCE]: ten losses each, every one within relative TOLERANCE (default 1e-5).
same() {
  /usr/bin/python3 - "$1" "$2" "${3:-1e-5}" <<'PY'
import sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
tolerance = float(sys.argv[3])
assert len(a) == len(b) == 10, (len(a), len(b))
for i, (x, y) in enumerate(zip(a, b)):
    assert abs(x - y) <= tolerance * abs(x), f"step {i + 1}: reference {x!r}, other run {y!r}"
PY
}
