# Shared by bench/dp and bench/tp (sourced): the model both measure.
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
