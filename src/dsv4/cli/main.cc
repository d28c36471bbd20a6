// dsv4 command line. The only translation unit that includes CLI11 (it is slow to compile).
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "dsv4/cli/commands.h"
#include "dsv4/util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"dsv4: DeepSeek V4 Flash on an ordinary CPU machine"};
  app.require_subcommand(1);

  dsv4::cli::InspectOptions inspect;
  auto* inspect_cmd = app.add_subcommand("inspect", "validate a checkpoint directory and describe it");
  inspect_cmd->add_option("dir", inspect.dir, "checkpoint directory")->required();
  inspect_cmd->add_flag("--json", inspect.json, "print JSON");

  auto add_model_options = [](CLI::App* cmd, dsv4::cli::ModelOptions& m) {
    cmd->add_option("-m,--model", m.dir, "checkpoint directory")->required();
    cmd->add_option("--numerics", m.numerics, "reference (float32 activations) or fast (quantized activations)")
        ->check(CLI::IsMember({"reference", "fast"}));
    cmd->add_option("--threads", m.threads, "compute threads (0 = all CPUs)")->check(CLI::Range(0, 1024));
    cmd->add_option("--ram", m.ram,
                    "memory budget for the whole process: 512M, 24G, 1.5G, or min (default: 80% of available "
                    "memory); routed experts beyond it stream from the SSD");
    cmd->add_option("--io", m.io, "expert reads: auto (io_uring, else threads), uring, threads")
        ->check(CLI::IsMember({"auto", "uring", "threads"}));
  };

  dsv4::cli::ScoreOptions score;
  auto* score_cmd = app.add_subcommand("score", "teacher-forced logits of a token sequence");
  add_model_options(score_cmd, score.model);
  score_cmd->add_option("--tokens-file", score.tokens_file, "token ids separated by whitespace or commas")->required();
  score_cmd->add_option("--logits-out", score.logits_out, "output: float32 little-endian [n_tokens, vocab]")->required();
  score_cmd->add_option("--chunk", score.chunk, "prefill chunk size (0 = whole sequence)")->check(CLI::Range(0, 1 << 30));

  dsv4::cli::GenerateOptions gen;
  auto* gen_cmd = app.add_subcommand("generate", "greedy continuation of a token sequence");
  add_model_options(gen_cmd, gen.model);
  gen_cmd->add_option("--tokens", gen.tokens, "prompt token ids, comma-separated")->required();
  gen_cmd->add_option("-n", gen.n, "tokens to generate")->check(CLI::Range(0, 1 << 30));
  gen_cmd->add_flag("--greedy", gen.greedy, "argmax decoding (the only mode of this command)");
  gen_cmd->add_flag("--print-ids", gen.print_ids, "print the generated ids comma-separated");
  gen_cmd->add_option("--chunk", gen.chunk, "prefill chunk size (0 = whole prompt)")->check(CLI::Range(0, 1 << 30));

  // dsv4 synth: synthetic checkpoints in the official format (real geometry by default).
  dsv4::cli::SynthCliOptions synth;
  auto* synth_cmd = app.add_subcommand("synth", "write a synthetic checkpoint (random weights, official format)");
  {
    dsv4::SynthOptions& s = synth.options;
    synth_cmd->add_option("--out", s.out, "output directory")->required();
    synth_cmd->add_flag("--demo", synth.demo, "the small deterministic demo model with a tokenizer (~90 MB)");
    synth_cmd->add_option("--layers", s.layers, "main layers")->check(CLI::Range(1, 1024));
    synth_cmd->add_option("--experts", s.experts, "routed experts per layer")->check(CLI::Range(1, 4096));
    synth_cmd->add_option("--experts-per-token", s.experts_per_token, "top-k")->check(CLI::Range(1, 4096));
    synth_cmd->add_option("--hidden", s.hidden, "hidden size")->check(CLI::Range(64, 65536));
    synth_cmd->add_option("--moe-inter", s.moe_inter, "expert intermediate size")->check(CLI::Range(64, 65536));
    synth_cmd->add_option("--heads", s.heads, "attention heads")->check(CLI::Range(1, 1024));
    synth_cmd->add_option("--head-dim", s.head_dim, "attention head dim")->check(CLI::Range(4, 4096));
    synth_cmd->add_option("--rope-dim", s.rope_dim, "rotary dims per head")->check(CLI::Range(2, 4096));
    synth_cmd->add_option("--q-lora", s.q_lora, "query low rank")->check(CLI::Range(1, 65536));
    synth_cmd->add_option("--o-groups", s.o_groups, "output projection groups")->check(CLI::Range(1, 1024));
    synth_cmd->add_option("--o-lora", s.o_lora, "output projection rank")->check(CLI::Range(1, 65536));
    synth_cmd->add_option("--index-heads", s.index_heads, "indexer heads")->check(CLI::Range(1, 1024));
    synth_cmd->add_option("--index-head-dim", s.index_head_dim, "indexer head dim")->check(CLI::Range(2, 4096));
    synth_cmd->add_option("--index-topk", s.index_topk, "indexer top-k")->check(CLI::Range(1, 1 << 20));
    synth_cmd->add_option("--vocab", s.vocab, "vocabulary size")->check(CLI::Range(16, 16'000'000));
    synth_cmd->add_option("--hash-layers", s.hash_layers, "hash-routed layers (default: 3 of 43, scaled)")
        ->check(CLI::Range(0, 1024));
    synth_cmd->add_option("--mtp", s.mtp_layers, "MTP layers (the real checkpoint has 1)")->check(CLI::Range(0, 16));
    synth_cmd->add_option("--shard-size", s.shard_bytes, "bytes per shard (approximate)")
        ->check(CLI::Range(uint64_t{1} << 20, uint64_t{1} << 40));
    synth_cmd->add_option("--seed", s.seed, "random seed");
    synth_cmd->add_flag("--quiet", synth.quiet, "no progress on stderr");
  }

  // dsv4 bench -m DIR: end-to-end model benchmark under a RAM budget. (`dsv4 bench kernels`
  // is a second mode of the same subcommand, selected by the optional positional.)
  dsv4::cli::BenchModelOptions bench;
  std::string bench_mode;
  auto* bench_cmd = app.add_subcommand("bench", "benchmarks: -m DIR (model under a RAM budget)");
  {
    auto& m = bench.model;
    bench_cmd->add_option("mode", bench_mode, "what to benchmark (default: the model given by -m)");
    bench_cmd->add_option("-m,--model", m.dir, "checkpoint directory");
    bench_cmd->add_option("--numerics", m.numerics, "reference or fast")->check(CLI::IsMember({"reference", "fast"}));
    bench_cmd->add_option("--threads", m.threads, "compute threads (0 = all CPUs)")->check(CLI::Range(0, 1024));
    bench_cmd->add_option("--ram", m.ram, "memory budget: 512M, 24G, 1.5G, or min (default: 80% of available)");
    bench_cmd->add_option("--io", m.io, "expert reads: auto, uring, threads")
        ->check(CLI::IsMember({"auto", "uring", "threads"}));
    bench_cmd->add_option("--prompt-tokens", bench.prompt_tokens, "prompt length")->check(CLI::Range(1, 1 << 24));
    bench_cmd->add_option("--gen-tokens", bench.gen_tokens, "tokens to decode")->check(CLI::Range(1, 1 << 24));
    bench_cmd->add_option("--chunk", bench.chunk, "prefill chunk size (0 = whole prompt)")->check(CLI::Range(0, 1 << 30));
    bench_cmd->add_option("--seed", bench.seed, "prompt seed");
    bench_cmd->add_option("--ssd-probe-bytes", bench.probe_bytes, "bytes of shard read to measure the SSD")
        ->check(CLI::Range(uint64_t{4} << 20, uint64_t{1} << 40));
    bench_cmd->add_option("--lookahead", bench.lookahead,
                          "guess experts ahead: off, exact (hash-routed layers only), all (also run routers early)")
        ->check(CLI::IsMember({"off", "exact", "all"}));
    bench_cmd->add_flag("--json", bench.json, "print one JSON object");
    bench_cmd->add_flag("--replay", bench.replay,
                        "replay the recorded expert requests with a synthetic compute model at several speeds");
    bench_cmd->add_option("--trace-out", bench.trace_out, "save the recorded expert requests to this file");
    bench_cmd->add_option("--trace-in", bench.trace_in, "replay a saved trace instead of running the model");
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*inspect_cmd) return dsv4::cli::inspect(inspect);
    if (*score_cmd) return dsv4::cli::score(score);
    if (*gen_cmd) return dsv4::cli::generate(gen);
    if (*synth_cmd) return dsv4::cli::synth(synth);
    if (*bench_cmd) {
      if (!bench_mode.empty()) throw dsv4::Error("bench: unknown mode \"" + bench_mode + "\" (use -m DIR)");
      if (bench.model.dir.empty()) throw dsv4::Error("bench: -m DIR is required");
      return dsv4::cli::bench_model(bench);
    }
  } catch (const dsv4::Error& e) {
    std::fprintf(stderr, "dsv4: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
