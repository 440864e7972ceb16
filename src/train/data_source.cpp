#include <cstdint>
#include <nlohmann/json.hpp>

#include "train/data_source.h"

#include "core/error.h"
#include "data/dataset_index.h"
#include "data/loader.h"
#include "data/tokenizer.h"

namespace zt::train {

namespace {

class LoaderSource : public BatchSource {
 public:
  LoaderSource(std::unique_ptr<data::DataLoader> loader) : loader_(std::move(loader)) {}
  void next(const Tensor& inputs, const Tensor& targets) override { loader_->next_batch(inputs, targets); }
  void reset() override { loader_->reset(); }
  nlohmann::json state() const override { return loader_->state(); }
  void restore(const nlohmann::json& s) override { loader_->restore(s.get<data::LoaderState>()); }

 private:
  std::unique_ptr<data::DataLoader> loader_;
};

}  // namespace

std::unique_ptr<TextCodec> open_codec(const std::string& tokenizer) {
  std::shared_ptr<data::Tokenizer> tok = data::load_tokenizer(tokenizer);
  auto codec = std::make_unique<TextCodec>();
  codec->encode = [tok](std::string_view text) { return tok->encode(text); };
  codec->decode = [tok](std::span<const uint32_t> ids) { return tok->decode(ids); };
  codec->eot_token = tok->eot_token();
  return codec;
}

TrainingData open_training_data(const Config& cfg, int dp_rank, int dp_size) {
  const std::vector<data::BlendPart> parts = cfg.data_parts();
  const int64_t T = cfg.train.seq_len;
  std::vector<data::BlendPart> val_parts;
  for (const data::BlendPart& part : parts) {
    const data::DatasetIndex index = data::DatasetIndex::load(part.dir);
    ZT_CHECK(int64_t(index.vocab_size) <= cfg.model.vocab_size, "the dataset in '", part.dir, "' uses ",
             index.vocab_size, " token ids (tokenizer ", index.tokenizer_name, ") but model.vocab_size = ",
             cfg.model.vocab_size, "; set model.vocab_size >= ", index.vocab_size, " or prepare the data with the "
             "model's tokenizer");
    // Validation blends the datasets whose val split holds a sample.
    if (index.val.tokens > uint64_t(T)) val_parts.push_back(part);
  }
  const std::string where = parts.size() == 1 ? "'" + parts[0].dir + "'" : "the blend";
  const uint64_t seed = uint64_t(cfg.train.seed);
  TrainingData out;
  // A validation loader over `of` (read in order from the start at every
  // evaluation): eval_batches micro-batches, fewer if the split is short.
  auto open_val = [&](const std::vector<data::BlendPart>& of, const std::string& what) {
    auto val = std::make_unique<data::DataLoader>(of, data::Split::val, T, seed, 0, 1);
    const int64_t needed = cfg.train.micro_batch * cfg.train.eval_batches;
    ZT_CHECK(val->samples_per_epoch() >= cfg.train.micro_batch,
             "the validation split of ", what, " has ", val->samples_per_epoch(), " samples of ", T + 1,
             " tokens, fewer than one micro-batch (", cfg.train.micro_batch,
             "); prepare with a larger --val-fraction or set train.eval_every = 0");
    val->set_global_batch(std::min<int64_t>(needed, val->samples_per_epoch() / cfg.train.micro_batch *
                                                        cfg.train.micro_batch));
    return std::make_unique<LoaderSource>(std::move(val));
  };
  auto train = std::make_unique<data::DataLoader>(parts, data::Split::train, T, seed, dp_rank, dp_size);
  train->set_global_batch(cfg.train.global_batch);
  out.train = std::make_unique<LoaderSource>(std::move(train));
  // Validation is read only by evaluations (train.eval_every > 0): without
  // them a split smaller than a micro-batch is no error.
  if (cfg.train.eval_every > 0 && !val_parts.empty()) {
    out.val = open_val(val_parts, where);
    if (cfg.train.eval_each_dataset)
      for (const data::BlendPart& part : val_parts)
        out.val_each.push_back({part.dir, open_val({{part.dir, 1.0}}, "'" + part.dir + "'")});
  }
  if (!cfg.data.tokenizer.empty()) out.codec = open_codec(cfg.data.tokenizer);
  return out;
}

}  // namespace zt::train
