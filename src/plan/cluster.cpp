#include "plan/cluster.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cpu/peak_rate.h"
#include "core/error.h"
#include "train/memory_plan.h"

namespace zt::plan {

namespace {

constexpr double kGiB = double(int64_t(1) << 30);

// Bytes/s one thread moves copying a buffer larger than the caches (read +
// write counted), the best of a few passes.
double measure_copy_bandwidth() {
  const size_t n = size_t(64) << 20;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    a[size_t(i)] = b[n - 1 - size_t(i)];  // keeps the copies from being elided
  }
  return 2.0 * double(n) / best;
}

// An 8-GPU Hopper node. Compute: cuBLAS bf16 8192^3 reaches ~798 TFLOP/s
// on an H100 (../shared/REFERENCES.md); Zettatron's training steps reached
// 47-58% MFU, 0.58-0.72 of that GEMM rate, on H100 and H200 (GPT-2 124M the
// low end, a Llama 3.2 1B shape the high one: bench/results/gpu-2026-11-26.md,
// gpu-2026-11-27.md) - 0.65 between them. Links, assumed (not measured
// here: the lent machines have one GPU): NCCL's ring bus bandwidth of about
// 360 GB/s over NVLink 4 (450 GB/s each way) and 45 GB/s per GPU over one
// 400 Gb/s NIC each. Host, assumed likewise (a DGX H100's): 2 TB of
// memory, 256 GB a GPU; pageable copies over PCIe 5 x16 at 20 GB/s each way
// (the trainer's host tensors are not pinned); 40 GB/s of the host's memory
// bandwidth for one GPU's share (14 of 112 cores) running AdamW.
Cluster hopper(const std::string& name, double memory_gib, double memory_bandwidth, const std::string& memory_note) {
  Cluster c;
  c.name = name;
  c.devices_per_node = 8;
  c.peak_flops = 989e12;
  c.matmul_flops = 798e12;
  c.step_efficiency = 0.65;
  c.memory_bytes = int64_t(memory_gib * kGiB);
  c.memory_bandwidth = memory_bandwidth;
  c.intra_node_bandwidth = 360e9;
  c.inter_node_bandwidth = 45e9;
  c.latency_seconds = 20e-6;
  c.host_memory_bytes = int64_t(256e9);
  c.host_link_bandwidth = 20e9;
  c.host_memory_bandwidth = 40e9;
  c.source = "bf16 989 TFLOP/s peak, GEMM 798 measured, step efficiency 0.65 measured (0.58-0.72); " + memory_note +
             "; links assumed: 360 GB/s NVLink ring, 45 GB/s per GPU between nodes; host assumed: 256 GB a GPU, "
             "20 GB/s PCIe copies, 40 GB/s of memory bandwidth";
  return c;
}

// This machine as one device (with_devices_per_node shares it among
// processes): the sgemm rate measured with every thread; Zettatron's CPU
// steps reach 63-77% of it (bench/results/moe-2026-12-03.md, cpu-*.md):
// 0.70. MPI between processes of one host copies through shared memory
// twice: half the copy rate (an estimate bench/plan checks).
Cluster this_cpu() {
  Cluster c;
  c.name = "cpu";
  c.gpu = false;
  const double machine = cpu::measure_sgemm_gflops() * 1e9;
  c.matmul_flops = machine;
  c.peak_flops = c.matmul_flops;  // the trainer's CPU MFU is of the measured sgemm rate
  c.step_efficiency = 0.70;
  c.memory_bytes = train::host_meminfo_bytes("MemTotal");
  c.memory_bandwidth = measure_copy_bandwidth();
  c.intra_node_bandwidth = c.inter_node_bandwidth = c.memory_bandwidth / 2;
  c.latency_seconds = 5e-6;
  // The device is the host: offloading copies within its memory.
  c.host_memory_bytes = c.memory_bytes;
  c.host_link_bandwidth = c.memory_bandwidth / 2;
  c.host_memory_bandwidth = c.memory_bandwidth;
  char buf[256];
  std::snprintf(buf, sizeof buf, "measured here: sgemm %.0f GFLOP/s on %d threads, copy %.1f GB/s on one",
                machine / 1e9, omp_get_max_threads(), c.memory_bandwidth / 1e9);
  c.source = buf;
  return c;
}

}  // namespace

std::vector<std::string> cluster_presets() { return {"h100-sxm", "h200-sxm", "cpu"}; }

Cluster cluster_preset(const std::string& name, int64_t nodes, int64_t devices_per_node) {
  ZT_CHECK(nodes >= 1, "a cluster has at least one node (got ", nodes, ")");
  ZT_CHECK(devices_per_node >= 0, "devices per node must be positive (got ", devices_per_node, ")");
  Cluster c;
  if (name == "h100-sxm")
    c = hopper(name, 78, 3.0e12, "80 GB HBM3 (78 GiB for training), copy 3.0 TB/s measured");
  else if (name == "h200-sxm")
    c = hopper(name, 138, 4.3e12, "141 GB HBM3e (138 GiB for training), copy 4.3 TB/s (the H100's measured share "
                                  "of its datasheet)");
  else if (name == "cpu")
    c = this_cpu();
  else {
    std::string names;
    for (const std::string& n : cluster_presets()) names += (names.empty() ? "" : ", ") + n;
    ZT_FAIL("no cluster preset '", name, "'; choose one of ", names, " (and override its numbers with the options)");
  }
  c.nodes = nodes;
  return devices_per_node > 0 ? with_devices_per_node(c, devices_per_node) : c;
}

Cluster with_devices_per_node(const Cluster& c, int64_t n) {
  ZT_CHECK(n >= 1, "devices per node must be positive (got ", n, ")");
  Cluster out = c;
  out.devices_per_node = n;
  if (!c.gpu) {
    const double share = double(c.devices_per_node) / double(n);
    out.matmul_flops *= share;
    out.peak_flops *= share;
    out.memory_bytes = int64_t(double(c.memory_bytes) * share);
    out.host_memory_bytes = int64_t(double(c.host_memory_bytes) * share);
  }
  return out;
}

std::string describe_cluster(const Cluster& c) {
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "%s: %lld node%s x %lld devices; per device %.1f TFLOP/s peak, GEMM %.1f, step efficiency %.2f, "
                "%.1f GiB, memory %.1f GB/s; links %.1f GB/s in a node, %.1f GB/s between, %.0f us per collective; "
                "host %.1f GiB, %.1f GB/s link, %.1f GB/s memory",
                c.name.c_str(), (long long)c.nodes, c.nodes == 1 ? "" : "s", (long long)c.devices_per_node,
                c.peak_flops / 1e12, c.matmul_flops / 1e12, c.step_efficiency, double(c.memory_bytes) / kGiB,
                c.memory_bandwidth / 1e9, c.intra_node_bandwidth / 1e9, c.inter_node_bandwidth / 1e9,
                c.latency_seconds * 1e6, double(c.host_memory_bytes) / kGiB, c.host_link_bandwidth / 1e9,
                c.host_memory_bandwidth / 1e9);
  return buf;
}

}  // namespace zt::plan
