# Shared by bench/dp, bench/tp and bench/cp (sourced): their setup and the
# model they measure.
#
# parallel_bench_setup NAME BUILD_DIR: sets bin (the CLI), tmp (a directory
# removed on exit) and data (the fortunes corpus, prepared if missing).
parallel_bench_setup() {
  bin="$2/bin/zettatron"
  tmp=$(mktemp -d "/tmp/zt_bench_$1.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  data=data/fortunes-gpt2
  test -f "$data/index.json" || "$bin" prepare --config configs/data/fortunes-gpt2.toml > /dev/null
}

# write_bench_config FILE DATA_DIR MICRO_BATCH: GPT-2 family, 4 layers,
# d_model 256, 4 heads, d_ff 1024, vocab 50257, T = 128, global batch 8,
# 4 steps, no samples.
write_bench_config() {
  cat > "$1" <<TOML
[model]
preset = "gpt2-124m"
n_layer = 4
d_model = 256
n_head = 4
d_ff = 1024
max_seq_len = 128
[data]
dir = "$2"
tokenizer = ""
[train]
seq_len = 128
global_batch = 8
micro_batch = $3
steps = 4
log_every = 100
[sample]
count = 0
[metrics]
peak_gflops = 1
TOML
}
