#include "parallel/pipeline.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

#include "core/error.h"
#include "ops/device.h"

namespace zt::parallel {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The message tag of a transfer into `stage` (of `stages`) for micro-batch
// mb: activations forward (backward = false) or gradients backward.
int transfer_tag(int64_t mb, int64_t stage, int64_t stages, bool backward) {
  return int((mb * stages + stage) * 2 + (backward ? 1 : 0));
}

}  // namespace

PipelineRunner::PipelineRunner(comm::ProcessGroup& pp, std::vector<nn::Transformer*> chunks, PipelineSchedule kind)
    : pp_(&pp), chunks_(std::move(chunks)), kind_(kind) {
  ZT_CHECK(!chunks_.empty(), "a pipeline rank needs at least one model chunk");
  const int64_t p = pp.size(), r = pp.rank(), v = int64_t(chunks_.size());
  for (int64_t c = 0; c < v; ++c) {
    const nn::ModelPart& part = chunks_[size_t(c)]->part();
    const int64_t stage = c * p + r;
    ZT_ASSERT(part.embedding == (stage == 0) && part.head == (stage == p * v - 1),
              "chunk ", c, " of pipeline rank ", r, " is stage ", stage, " but holds the wrong ends of the model");
  }
  // The head stage splits the LM head's work forward : backward : weight
  // like a block's, as the schedules assume (it keeps dlogits in between).
  for (nn::Transformer* c : chunks_) c->head_keeps_dlogits = c->part().head;
  if (chunks_.front()->config().tied_embeddings && p > 1) {
    const bool end = r == 0 || r == p - 1;
    tied_group_ = pp.split(end ? 0 : int(1 + r), int(r), "pp_tied");
  }
}

PipelineRunner::StepResult PipelineRunner::run(const std::vector<PipelineMicroBatch>& mbs, float grad_scale) {
  const int64_t p = pp_->size(), r = pp_->rank(), v = int64_t(chunks_.size()), m = int64_t(mbs.size());
  const int64_t S = p * v;
  ZT_CHECK(m >= 1, "a pipeline step needs at least one micro-batch");
  const std::vector<Action> actions = build_pipeline_schedule(kind_, PipelineShape{p, m, v})[size_t(r)];
  // What travels between stages: (R, C) rows of the residual stream.
  const nn::Transformer& first = *chunks_.front();
  const int64_t B = mbs.front().tokens.size(0), T = mbs.front().tokens.size(1), C = first.config().d_model;
  const nn::TensorParallel& tp = first.tensor_parallel();
  const bool sp = tp.sequence_parallel && tp.size() > 1;
  const int64_t R = sp ? B * T / tp.size() : B * T;
  const DType dtype = first.compute_dtype();
  const Device device = first.device();

  const auto t0 = Clock::now();
  events_.clear();
  StepResult out;
  auto stage_of = [&](const Action& a) { return a.chunk * p + r; };
  auto event = [&](const char* name, const Action& a, double start) {
    events_.push_back({name, a.micro_batch, a.chunk, start, since(t0)});
  };
  // Receives, posted a few actions ahead: (kind, mb, chunk) -> buffer and work.
  struct Posted {
    Tensor buf;
    comm::WorkHandle work;
  };
  std::map<std::tuple<int, int64_t, int64_t>, Posted> recvs;
  auto post_recv = [&](const Action& a) {
    const int64_t s = stage_of(a);
    const bool fwd = a.kind == ActionKind::forward;
    if (!receives_before(a, s, S)) return;
    const auto key = std::make_tuple(int(a.kind), a.micro_batch, a.chunk);
    if (recvs.count(key)) return;
    Posted pr{Tensor::empty(Shape{R, C}, dtype, device, MemCategory::activations), nullptr};
    const int src = int(fwd ? (r + p - 1) % p : (r + 1) % p);
    pr.work = pp_->recv(pr.buf, src, transfer_tag(a.micro_batch, s, S, !fwd));
    recvs[key] = std::move(pr);
  };
  auto take_recv = [&](const Action& a) {
    auto it = recvs.find(std::make_tuple(int(a.kind), a.micro_batch, a.chunk));
    ZT_ASSERT(it != recvs.end(), "pipeline receive not posted");
    const double start = since(t0);
    it->second.work->wait();
    const double waited = since(t0) - start;
    out.idle_seconds += waited;
    if (waited > 0) event("recv_wait", a, start);
    Tensor buf = it->second.buf;
    recvs.erase(it);
    return buf;
  };
  std::vector<std::pair<comm::WorkHandle, Tensor>> sends;  // buffers kept until sent
  auto reap_sends = [&](bool all) {
    for (auto it = sends.begin(); it != sends.end();) {
      if (all) {
        const double start = since(t0);
        it->first->wait();
        out.idle_seconds += since(t0) - start;
      }
      if (all || it->first->test())
        it = sends.erase(it);
      else
        ++it;
    }
  };
  // contexts[chunk][micro-batch]: activations between a forward and its backward.
  std::vector<std::vector<nn::ForwardContext>> contexts(static_cast<size_t>(v));
  for (auto& c : contexts) c.resize(static_cast<size_t>(m));
  int64_t in_flight = 0;
  for (size_t i = 0; i < actions.size(); ++i) {
    for (size_t j = i; j < std::min(actions.size(), i + kRecvLookahead); ++j) post_recv(actions[j]);
    const Action& a = actions[i];
    const int64_t s = stage_of(a);
    nn::Transformer& chunk = *chunks_[size_t(a.chunk)];
    nn::ForwardContext& ctx = contexts[size_t(a.chunk)][size_t(a.micro_batch)];
    const PipelineMicroBatch& mb = mbs[size_t(a.micro_batch)];
    if (a.kind == ActionKind::forward) {
      const Tensor input = receives_before(a, s, S) ? take_recv(a) : Tensor();
      const double start = since(t0);
      const Tensor y = chunk.forward_part(ctx, input, mb.tokens, mb.targets, true, grad_scale);
      out.compute_seconds += since(t0) - start;
      out.forward_seconds += since(t0) - start;
      event("forward", a, start);
      out.aux_weighted += ctx.aux_loss * double(ctx.B * ctx.T);
      out.expert_load_max = std::max(out.expert_load_max, ctx.expert_load_max);
      out.expert_dropped_max = std::max(out.expert_dropped_max, ctx.expert_dropped_max);
      if (sends_after(a, s, S)) {
        sends.push_back({pp_->send(y, int((r + 1) % p), transfer_tag(a.micro_batch, s + 1, S, false)), y});
      } else {  // the last stage: the loss
        out.loss_sum += ctx.loss_sum;
        out.loss_tokens += ctx.loss_tokens;
      }
      out.peak_in_flight = std::max(out.peak_in_flight, ++in_flight);
    } else if (a.kind == ActionKind::backward_weight) {
      // Zero bubble: the weight gradients deferred by backward_input.
      if (before_backward) before_backward(a.chunk, a.micro_batch == m - 1);
      const double start = since(t0);
      chunk.backward_weight(ctx);
      out.compute_seconds += since(t0) - start;
      event("backward_weight", a, start);
      --in_flight;
    } else {
      const bool split = a.kind == ActionKind::backward_input;
      if (!split && before_backward) before_backward(a.chunk, a.micro_batch == m - 1);
      const Tensor d_out = receives_before(a, s, S) ? take_recv(a) : Tensor();
      const double start = since(t0);
      const Tensor d_in = split ? chunk.backward_input(ctx, d_out) : chunk.backward_part(ctx, d_out);
      out.compute_seconds += since(t0) - start;
      event(split ? "backward_input" : "backward", a, start);
      if (sends_after(a, s, S))
        sends.push_back({pp_->send(d_in, int((r + p - 1) % p), transfer_tag(a.micro_batch, s - 1, S, true)), d_in});
      if (!split) --in_flight;
    }
    reap_sends(false);
  }
  reap_sends(true);
  ZT_ASSERT(recvs.empty(), "pipeline: receives left unused at the end of the step");
  out.seconds = since(t0);
  return out;
}

PipelineRunner::StepResult PipelineRunner::evaluate(const std::vector<PipelineMicroBatch>& mbs) {
  const int64_t p = pp_->size(), r = pp_->rank(), v = int64_t(chunks_.size()), S = p * v;
  const nn::Transformer& first = *chunks_.front();
  StepResult out;
  if (mbs.empty()) return out;
  const int64_t B = mbs.front().tokens.size(0), T = mbs.front().tokens.size(1), C = first.config().d_model;
  const nn::TensorParallel& tp = first.tensor_parallel();
  const int64_t R = tp.sequence_parallel && tp.size() > 1 ? B * T / tp.size() : B * T;
  std::vector<std::pair<comm::WorkHandle, Tensor>> sends;
  for (size_t k = 0; k < mbs.size(); ++k)
    for (int64_t c = 0; c < v; ++c) {
      const int64_t s = c * p + r;
      Tensor input;
      if (s > 0) {
        input = Tensor::empty(Shape{R, C}, first.compute_dtype(), first.device(), MemCategory::activations);
        pp_->recv(input, int((r + p - 1) % p), transfer_tag(int64_t(k), s, S, false))->wait();
      }
      nn::ForwardContext ctx;
      const Tensor y = chunks_[size_t(c)]->forward_part(ctx, input, mbs[k].tokens, mbs[k].targets, false, 0.0f);
      if (s == S - 1) {
        out.loss_sum += ctx.loss_sum;
        out.loss_tokens += ctx.loss_tokens;
      } else {
        sends.push_back({pp_->send(y, int((r + 1) % p), transfer_tag(int64_t(k), s + 1, S, false)), y});
      }
    }
  for (auto& [w, t] : sends) w->wait();
  return out;
}

Tensor PipelineRunner::last_logits(const Tensor& tokens, std::vector<nn::KvCache>* caches) {
  const int64_t p = pp_->size(), r = pp_->rank(), v = int64_t(chunks_.size()), S = p * v;
  const nn::Transformer& first = *chunks_.front();
  ZT_CHECK(tokens.defined() && tokens.ndim() == 2, "last_logits takes (B, T) token rows, got ", tokens.str());
  ZT_CHECK(!caches || int64_t(caches->size()) == v, "last_logits: ", caches ? caches->size() : 0,
           " KV caches for this rank's ", v, " chunks: make them with make_kv_caches");
  const int64_t B = tokens.size(0), T = tokens.size(1), C = first.config().d_model, Vp = first.config().padded_vocab();
  Tensor rows;  // the head stage's last rows; the other ranks receive them
  std::vector<std::pair<comm::WorkHandle, Tensor>> sends;
  for (int64_t c = 0; c < v; ++c) {
    const int64_t s = c * p + r;
    Tensor input;
    if (s > 0) {
      input = Tensor::empty(Shape{B * T, C}, first.compute_dtype(), first.device(), MemCategory::activations);
      pp_->recv(input, int((r + p - 1) % p), transfer_tag(0, s, S, false))->wait();
    }
    nn::Transformer& chunk = *chunks_[size_t(c)];
    nn::KvCache* cache = caches ? &(*caches)[size_t(c)] : nullptr;
    if (s < S - 1) {
      const Tensor y = chunk.logits_part(Tensor(), input, tokens, false, cache);
      sends.push_back({pp_->send(y, int((r + 1) % p), transfer_tag(0, s + 1, S, false)), y});
    } else {
      Tensor out = Tensor::empty(Shape{B, Vp}, DType::f32, first.device(), MemCategory::activations);
      chunk.logits_part(out, input, tokens, true, cache);  // the last positions' alone
      rows = ops::to_device(out, Device::cpu());
    }
  }
  for (auto& [w, t] : sends) w->wait();
  if (!rows.defined()) rows = Tensor::empty(Shape{B, Vp}, DType::f32, Device::cpu(), MemCategory::activations);
  pp_->broadcast(rows, int(p - 1))->wait();
  return rows;
}

std::vector<nn::KvCache> PipelineRunner::make_kv_caches(int64_t batch, int64_t capacity) const {
  std::vector<nn::KvCache> caches;
  for (const auto* chunk : chunks_) caches.push_back(chunk->make_kv_cache(batch, capacity));
  return caches;
}

void PipelineRunner::sync_tied_embedding() {
  if (!tied_group_ || tied_group_->size() < 2) return;
  nn::Transformer& holder = first_rank() ? *chunks_.front() : *chunks_.back();
  tied_group_->all_reduce(holder.grad("embed.wte"))->wait();
}

std::vector<std::vector<PipelineEvent>> gather_pipeline_events(comm::ProcessGroup& pp,
                                                               const std::vector<PipelineEvent>& mine) {
  // One line per event: name, micro-batch, chunk, start, end.
  std::string text;
  char line[256];
  for (const PipelineEvent& e : mine) {
    std::snprintf(line, sizeof line, "%s %lld %lld %.9f %.9f\n", e.name.c_str(), (long long)e.micro_batch,
                  (long long)e.chunk, e.start, e.end);
    text += line;
  }
  std::vector<std::vector<PipelineEvent>> out;
  for (const std::string& rank_text : comm::all_gather_strings(pp, text)) {
    out.emplace_back();
    size_t at = 0;
    while (at < rank_text.size()) {
      const size_t end = rank_text.find('\n', at);
      char name[64];
      long long mb = 0, chunk = 0;
      double t0 = 0, t1 = 0;
      if (std::sscanf(rank_text.substr(at, end - at).c_str(), "%63s %lld %lld %lf %lf", name, &mb, &chunk, &t0, &t1) == 5)
        out.back().push_back({name, mb, chunk, t0, t1});
      at = end == std::string::npos ? rank_text.size() : end + 1;
    }
  }
  return out;
}

std::string chrome_trace_json(const std::vector<std::vector<PipelineEvent>>& events) {
  std::string s = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  char buf[512];
  for (size_t r = 0; r < events.size(); ++r) {
    std::snprintf(buf, sizeof buf, "%s{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %zu, "
                  "\"args\": {\"name\": \"rank %zu\"}}", first ? "" : ",\n", r, r);
    s += buf;
    first = false;
    for (const PipelineEvent& e : events[r]) {
      std::snprintf(buf, sizeof buf, ",\n{\"name\": \"%s mb%lld c%lld\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, "
                    "\"tid\": %zu, \"ts\": %.3f, \"dur\": %.3f, \"args\": {\"micro_batch\": %lld, \"chunk\": %lld}}",
                    e.name.c_str(), (long long)e.micro_batch, (long long)e.chunk, e.name.c_str(), r, e.start * 1e6,
                    (e.end - e.start) * 1e6, (long long)e.micro_batch, (long long)e.chunk);
      s += buf;
    }
  }
  s += "\n]}\n";
  return s;
}

}  // namespace zt::parallel
