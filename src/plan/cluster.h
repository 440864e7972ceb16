// The machines a plan is for: each device's compute rate, memory and links.
// The presets' rates are measurements (bench/results/) or, where named so,
// the datasheet; `zettatron plan` can override every field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zt::plan {

struct Cluster {
  std::string name;
  int64_t nodes = 1, devices_per_node = 1;
  double peak_flops = 0;            // per device, dense (bf16 on GPUs, f32 on CPUs): MFU's denominator
  double matmul_flops = 0;          // per device: what a large GEMM reaches (measured)
  // The share of matmul_flops a training step's model FLOPs reach on one
  // device (its attention, norms, activations and launches included):
  // calibrated from measured runs of Zettatron (see the presets).
  double step_efficiency = 0;
  int64_t memory_bytes = 0;         // per device, for training
  double memory_bandwidth = 0;      // per device, bytes/s (the optimizer's passes over its state)
  // Bytes/s a ring collective moves per device (bus bandwidth) over the
  // links inside a node and between nodes; the latency of one operation.
  double intra_node_bandwidth = 0, inter_node_bandwidth = 0;
  double latency_seconds = 0;
  // Offloading (optim.offload, train.offload_activations): host memory per
  // device (its share of the node's), bytes/s each way over a device's link
  // to the host (PCIe for a GPU), and the host memory bandwidth a device's
  // share of the host's cores reaches in the offloaded optimizer's passes.
  int64_t host_memory_bytes = 0;
  double host_link_bandwidth = 0, host_memory_bandwidth = 0;
  bool gpu = true;                  // GPUs (else CPUs)
  std::string source;               // where the numbers come from, for the report
  int64_t devices() const { return nodes * devices_per_node; }
};

// A preset by name (cluster_presets()): `nodes` of `devices_per_node`
// devices each (0: the preset's own count). "cpu" measures this machine:
// its sgemm rate on one thread times the cores each of the devices (one
// process each) gets, and its copy rate. Throws zt::Error naming the
// presets for another name.
Cluster cluster_preset(const std::string& name, int64_t nodes = 1, int64_t devices_per_node = 0);
std::vector<std::string> cluster_presets();

// The same machines as `n` devices a node: GPUs are devices (only the
// count changes); a CPU host's processes share its sgemm rate and memory
// (linear in the cores they split), so each device's share changes.
Cluster with_devices_per_node(const Cluster& c, int64_t n);

// One line: devices, rates, memory, links.
std::string describe_cluster(const Cluster& c);

}  // namespace zt::plan
