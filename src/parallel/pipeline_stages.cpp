#include "parallel/pipeline_stages.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"

namespace zt::parallel {

namespace {

// Training FLOPs per token (forward + backward = 3x forward) of one block at
// sequence length T: 6 x its matmul weights + 12 C T of attention scores
// and values (as ModelConfig::train_flops_per_token counts them).
double block_cost(const nn::ModelConfig& c, int64_t T) {
  const double C = double(c.d_model);
  const double matmul = double(c.qkv_width()) * C + C * C + double(c.active_mlp_params());
  return 6.0 * matmul + 12.0 * C * double(T);
}

}  // namespace

std::vector<StageLayers> plan_pipeline_stages(const nn::ModelConfig& cfg, int64_t seq_len, int64_t stages,
                                              const std::vector<int64_t>& blocks_per_stage) {
  const int64_t L = cfg.n_layer, S = stages;
  ZT_CHECK(S >= 1, "pipeline: ", S, " stages; need at least 1");
  ZT_CHECK(L >= S, "pipeline: the model has ", L, " blocks (model.n_layer) but the pipeline has ", S,
           " stages (pp x virtual_stages); every stage needs at least one block: lower parallel.pp or "
           "parallel.virtual_stages");
  const double block = block_cost(cfg, seq_len), head = 6.0 * double(cfg.vocab_size) * double(cfg.d_model),
               embed = 2.0 * double(cfg.d_model);
  // The memory planner asks again for every stage and tensor-parallel rank
  // of a layout: the last answer is kept, keyed by everything it reads.
  thread_local struct {
    std::tuple<int64_t, int64_t, double, double, double, std::vector<int64_t>> key{-1, -1, 0, 0, 0, {}};
    std::vector<StageLayers> stages;
  } last;
  auto key = std::make_tuple(L, S, block, head, embed, blocks_per_stage);
  if (key == last.key) return last.stages;
  std::vector<int64_t> counts = blocks_per_stage;
  if (!counts.empty()) {
    ZT_CHECK(int64_t(counts.size()) == S, "parallel.pp_layers lists ", counts.size(), " stages, but the pipeline has ",
             S, " (pp x virtual_stages); give one block count per stage");
    int64_t sum = 0;
    for (size_t s = 0; s < counts.size(); ++s) {
      ZT_CHECK(counts[s] >= 1, "parallel.pp_layers: stage ", s, " has ", counts[s], " blocks; every stage needs at least one");
      sum += counts[s];
    }
    ZT_CHECK(sum == L, "parallel.pp_layers adds up to ", sum, " blocks, but the model has ", L, " (model.n_layer)");
  } else {
    // Contiguous split minimising the most expensive stage (dynamic
    // programming over (stages used, blocks used); ties prefer earlier
    // stages holding fewer blocks, deterministically).
    const double inf = std::numeric_limits<double>::infinity();
    auto stage_cost = [&](int64_t s, int64_t n) {
      return double(n) * block + (s == 0 ? embed : 0.0) + (s == S - 1 ? head : 0.0);
    };
    // best[s][l]: the smallest max-cost of splitting the first l blocks into stages 0..s-1.
    std::vector<std::vector<double>> best(size_t(S + 1), std::vector<double>(size_t(L + 1), inf));
    std::vector<std::vector<int64_t>> cut(size_t(S + 1), std::vector<int64_t>(size_t(L + 1), 0));
    best[0][0] = 0;
    for (int64_t s = 1; s <= S; ++s)
      for (int64_t l = s; l <= L - (S - s); ++l)
        for (int64_t n = 1; n <= l - (s - 1); ++n) {
          const double c = std::max(best[size_t(s - 1)][size_t(l - n)], stage_cost(s - 1, n));
          if (c < best[size_t(s)][size_t(l)]) {
            best[size_t(s)][size_t(l)] = c;
            cut[size_t(s)][size_t(l)] = n;
          }
        }
    counts.assign(size_t(S), 0);
    for (int64_t s = S, l = L; s >= 1; --s) {
      counts[size_t(s - 1)] = cut[size_t(s)][size_t(l)];
      l -= counts[size_t(s - 1)];
    }
  }
  std::vector<StageLayers> out;
  int64_t first = 0;
  for (int64_t s = 0; s < S; ++s) {
    StageLayers st{first, first + counts[size_t(s)], s == 0, s == S - 1, 0};
    st.cost = double(st.last - st.first) * block + (st.embedding ? embed : 0.0) + (st.head ? head : 0.0);
    out.push_back(st);
    first = st.last;
  }
  last.key = std::move(key);
  last.stages = out;
  return out;
}

std::vector<int64_t> parse_stage_layers(std::string_view text) {
  std::vector<int64_t> out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && text[i] == ' ') ++i;
    size_t j = i;
    while (j < text.size() && text[j] != ',') ++j;
    std::string_view item = text.substr(i, j - i);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    int64_t v = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    ZT_CHECK(!item.empty() && ec == std::errc() && ptr == item.data() + item.size(), "parallel.pp_layers = '", text,
             "' is not a comma-separated list of block counts (e.g. \"4,4,3,3\")");
    out.push_back(v);
    i = j + 1;
  }
  return out;
}

}  // namespace zt::parallel
