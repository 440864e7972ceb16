// One step's timeline on every rank (train/step_trace.h).
#include "train/step_trace.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "ops/device.h"
#include "ops/op_profile.h"

namespace zt::train {

using json = nlohmann::json;

namespace {

json to_json(const RankTrace& t) {
  json spans = json::array();
  for (const TraceSpan& s : t.spans) spans.push_back({s.track, s.name, s.start_us, s.dur_us});
  return {{"rank", t.rank}, {"spans", std::move(spans)}};
}

RankTrace from_json(const json& j) {
  RankTrace t;
  t.rank = j.at("rank").get<int64_t>();
  for (const json& s : j.at("spans"))
    t.spans.push_back({s.at(0).get<std::string>(), s.at(1).get<std::string>(), s.at(2).get<double>(),
                       s.at(3).get<double>()});
  return t;
}

// The JSON string escape of s (names come from ops and groups: plain ASCII,
// but a quote or backslash must not break the file).
std::string json_string(const std::string& s) { return json(s).dump(); }

}  // namespace

void begin_step_trace(Device device) {
  trace_begin();
  ops::begin_op_trace(device);
}

std::vector<RankTrace> end_step_trace(Device device, const parallel::Mesh* mesh) {
  ops::synchronize(device);
  ops::end_op_trace();
  std::vector<RankTrace> all{{mesh ? mesh->world_rank() : 0, trace_end()}};
  if (!mesh) return all;
  // Successive gathers over the mesh's dimensions: after each, every rank
  // holds the traces of all ranks that differ from it in the dimensions so far.
  for (comm::ProcessGroup* g : {&mesh->tp(), &mesh->cp(), &mesh->pp(), &mesh->dp()}) {
    if (g->size() == 1) continue;
    json mine = json::array();
    for (const RankTrace& t : all) mine.push_back(to_json(t));
    all.clear();
    for (const std::string& text : comm::all_gather_strings(*g, mine.dump()))
      for (const json& t : json::parse(text)) all.push_back(from_json(t));
  }
  std::sort(all.begin(), all.end(), [](const RankTrace& a, const RankTrace& b) { return a.rank < b.rank; });
  return all;
}

std::string chrome_trace_json(const std::vector<RankTrace>& ranks) {
  // Tracks in a fixed order first (the step, the host, the ops), then the comm groups by name.
  auto track_order = [](const std::string& track) {
    static const std::vector<std::string> first = {"step", "host", "ops"};
    const auto it = std::find(first.begin(), first.end(), track);
    return it != first.end() ? int(it - first.begin()) : int(first.size());
  };
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [";
  bool first_event = true;
  auto event = [&](const std::string& e) {
    out += (first_event ? "\n" : ",\n") + e;
    first_event = false;
  };
  char buf[256];
  for (const RankTrace& r : ranks) {
    event("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(r.rank) +
          ", \"args\": {\"name\": \"rank " + std::to_string(r.rank) + "\"}}");
    std::vector<std::string> tracks;
    for (const TraceSpan& s : r.spans)
      if (std::find(tracks.begin(), tracks.end(), s.track) == tracks.end()) tracks.push_back(s.track);
    std::stable_sort(tracks.begin(), tracks.end(), [&](const std::string& a, const std::string& b) {
      return track_order(a) != track_order(b) ? track_order(a) < track_order(b) : a < b;
    });
    std::map<std::string, size_t> tid;
    for (size_t i = 0; i < tracks.size(); ++i) {
      tid[tracks[i]] = i;
      event("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + std::to_string(r.rank) +
            ", \"tid\": " + std::to_string(i) + ", \"args\": {\"name\": " + json_string(tracks[i]) + "}}");
      event("{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": " + std::to_string(r.rank) +
            ", \"tid\": " + std::to_string(i) + ", \"args\": {\"sort_index\": " + std::to_string(i) + "}}");
    }
    for (const TraceSpan& s : r.spans) {
      std::snprintf(buf, sizeof buf, ", \"ph\": \"X\", \"pid\": %lld, \"tid\": %zu, \"ts\": %.3f, \"dur\": %.3f}",
                    (long long)r.rank, tid[s.track], s.start_us, s.dur_us);
      event("{\"name\": " + json_string(s.name) + ", \"cat\": " + json_string(s.track) + buf);
    }
  }
  out += "\n]}\n";
  return out;
}

}  // namespace zt::train
