// SPDX-License-Identifier: BSD-3-Clause
// oktopk-train: data-parallel SGD on Fashion-MNIST (two classifiers) or on the King James
// Bible (a word-level LSTM language model), the gradient of every step averaged over the ranks
// by one of OkTopk's sparse allreduce methods.
#include "checkpoint.hpp"
#include "common/app_failure.hpp"
#include "common/cli.hpp"
#include "common/gradient_file.hpp"
#include "model.hpp"
#include "overlapped_allreduce.hpp"
#include "training_task.hpp"

#include <oktopk/oktopk.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

using oktopk::apps::parse_number;
using oktopk::apps::UsageError;
using Exec = oktopk::train::ExecutionSpace;
using Memory = oktopk::train::MemorySpace;

// The build's copy of the King James Bible (apps/oktopk-train/CMakeLists.txt).
#ifndef OKTOPK_TRAIN_DEFAULT_TEXT
#define OKTOPK_TRAIN_DEFAULT_TEXT "kjv-verses.txt"
#endif

constexpr const char* usage = R"(Usage: mpirun -np P oktopk-train [options] [--kokkos-... flags]

Trains a small model with data-parallel SGD (momentum, weight decay): every rank trains on its
own shard, and each step's gradient (all parameters in one flat buffer) is averaged over the
ranks by the chosen OkTopk method. The classifiers (mlp, cnn) learn Fashion-MNIST; lstm is a
word-level language model of the King James Bible. Prints one line per epoch on rank 0 and a
final line "final test_acc=0.XXXX" (classifiers) or "final test_ppl=X.XX" (lstm).

Options:
  --model NAME          mlp, cnn or lstm                                     (default mlp)
  --algo NAME           dense topka topkdsa gtopk gaussiank oktopk s2        (default oktopk)
  --density D           fraction of the gradient each step selects, [0, 1]   (default 0.01)
  --epochs E            passes over the training set, >= 1                   (default 5)
  --batch B             mini-batch per rank, >= 1: images, or windows of --bptt words
                                                              (default 64; lstm: 32)
  --lr LR               learning rate, > 0                    (default 0.05; lstm: 1)
  --lr-decay F          multiply the learning rate by F after every epoch    (default 1)
  --momentum M          SGD momentum, [0, 1)                                 (default 0.9)
  --momentum-correction on|off
                        on: every rank keeps its own velocity and the allreduce averages
                        velocities, so error feedback holds back velocity, not gradient (DGC's
                        momentum correction); off: momentum is applied to the averaged
                        gradient. For topka topkdsa gtopk gaussiank oktopk; dense and s2
                        always apply momentum after the allreduce            (default on)
  --sparse-result on|off
                        on: with momentum correction, the allreduce returns the averaged
                        velocity as indices and values (reduce_sparse) and the step updates
                        those parameters only, with no pass over all of them; off: it writes
                        all n entries and the step reads them. The same parameters either
                        way; on needs momentum correction (with it: default on; else off)
  --weight-decay W      L2 weight decay, >= 0                                (default 0.0001)
  --dense-warmup N      first N steps use a dense allreduce                  (default 0)
  --overlap on|off      with --algo dense and --model lstm: on, the gradient's blocks are summed
                        by MPI_Iallreduce (buckets of at most --bucket-kib) as soon as the
                        backward pass has finished them, the output layer's first, while the
                        pass goes on (the baseline that overlaps communication with backprop);
                        --wire bf16 divides by P, rounds to bfloat16 and sums in bfloat16, as
                        DDP's bf16_compress_hook (not --wire fp16, --dump-gradients or the
                        dense_allreduce and hierarchical options). The bytes column is then a
                        ring's count. Host builds only                        (default off)
  --bucket-kib K        with --overlap on: the largest bucket in KiB of float32, >= 1
                                                     (default 25600: DDP's bucket_cap_mb 25)
  --wire W              the values' type on the wire: native (float), fp32, bf16 or fp16
                        (the model stays float32); bf16 and fp16 round every value sent and
                        sum in float; with --algo dense, on the ring: the 16-bit dense
                        baseline, as DDP's bf16_compress_hook; the methods with error
                        feedback keep each rounding error in the residual  (default native)
  --option KEY=VALUE    any other oktopk::Options field by its name (repeatable), e.g.
                        --option guard_low=0 --option guard_factor=1.3333 (the reference's
                        one-sided guard); names and defaults: docs/reference.md, "Options"
  --seed S              model initialization and shuffling                   (default 1)
  --data DIR            Fashion-MNIST IDX gz files       (default /usr/share/datasets/fashion-mnist)

Language model (--model lstm): embedding V x E (its gradient is non-zero only in the rows of
the batch's words), one LSTM layer of H units, dense H -> V, softmax over the next word; each
window of T words starts from a zero state (backpropagation through time truncated at T).
Words are lowercased letter runs (punctuation dropped) plus an end-of-verse token; every 20th
verse is held out for the test perplexity, exp(mean cross-entropy per word).
  --text FILE           the King James Bible, one verse a line, as scripts/kjv-corpus.sh FILE
                        writes it with the Debian packages bible-kjv and bible-kjv-text
                        (default: the build's copy, )" OKTOPK_TRAIN_DEFAULT_TEXT R"()
  --vocab V             vocabulary: the V - 2 most frequent training words, <unk> and
                        </s>, >= 3                                           (default 10000)
  --embed E             embedding width, >= 1                                (default 64)
  --hidden H            LSTM units, >= 1                                     (default 128)
  --bptt T              words per window, >= 1                               (default 20)
  --tokens-per-epoch N  cap on words predicted per epoch, all ranks together; 0: the whole
                        training text (about 780,000 words)             (default 400000)
  --csv FILE            also write one CSV row per epoch to FILE (rank 0)
  --dump-gradients FILE write every rank's allreduce input (its gradient; with momentum
                        correction, its velocity) of the first --dump-steps steps, in
                        the format oktopk-bench --dist file:FILE replays
  --dump-steps N        steps to dump, >= 1                                  (default 8)
  --steps-per-epoch N   cap on steps per epoch (quick runs and tests)       (default: all)
  --checkpoint FILE     save checkpoints: each rank R writes FILE.rank<R> (model, momentum,
                        position in the data, learning rate, the epoch's sums so far, and its
                        allreduce state: residual, thresholds, regions); every rank writes
                        FILE.rank<R>.tmp first, and all are renamed only once every rank's is
                        complete, so an existing checkpoint is never half-overwritten
  --checkpoint-every N  save after every N-th step, counted from the start of training;
                        0: at the end of every epoch                         (default 0)
  --resume FILE         continue from the checkpoint FILE.rank<R>: the run then ends exactly
                        (bit for bit) as an uninterrupted one would; --epochs is the total, and
                        every other setting that shapes training (model, algo, density, batch,
                        lr, lr-decay, momentum, momentum-correction, weight-decay,
                        dense-warmup, --option, seed, steps per epoch, P; lstm: vocab, embed,
                        hidden, bptt, tokens-per-epoch; overlap, bucket-kib) must be the
                        one the checkpoint was written with. --csv appends to an existing
                        file. Not with --dump-gradients.
  --help                print this text

Run with OMP_WAIT_POLICY=passive (and OPENBLAS_NUM_THREADS=1 when ranks share cores): spinning
OpenMP threads otherwise starve the BLAS threads of the matrix multiplies.

Per epoch: epoch, mean training loss over the ranks, test accuracy (lstm: "ppl=" and the test
perplexity), seconds, bytes per rank per step (the larger of sent and received, averaged over
steps and ranks), and the achieved density (non-zeros of the averaged gradient, or entries of
its sparse form, / parameters, averaged over steps). The last line, "final parameter_digest=<16 hex digits>", is a digest of
the final parameters (equal on all ranks), for comparing runs. An epoch resumed mid-way reports the seconds of its resumed part.

Schedules measured at P = 4 (docs/benchmarks.md), dense and oktopk at 0.01: mlp --batch 64
--lr 0.05 --lr-decay 0.8 --epochs 5 (0.8812, 0.8800); cnn --batch 32 --lr 0.01 --lr-decay 0.8
--epochs 8 (0.9050, 0.9061); lstm with its defaults, --epochs 3 (ppl=140.24, ppl=143.17).
)";

/// The language model's defaults where they differ from the classifiers'.
constexpr std::int64_t lstm_default_batch = 32;
constexpr double lstm_default_lr = 1.0;
constexpr std::int64_t lstm_default_tokens_per_epoch = 400000;

struct Settings {
  std::string model = "mlp";
  oktopk::Algorithm algorithm = oktopk::Algorithm::OkTopk;
  double density = 0.01;
  std::int64_t epochs = 5;
  std::int64_t batch = 0;  // 0 until parse() sets the model's default
  double lr = 0.0;         // 0 until parse() sets the model's default
  double lr_decay = 1.0;
  double momentum = 0.9;
  bool momentum_correction = true;
  std::string sparse_result;  // "on", "off", or empty: on where momentum correction applies
  double weight_decay = 1e-4;
  std::int64_t dense_warmup = 0;
  bool overlap = false;
  std::int64_t bucket_kib = 25 * 1024;
  /// --option KEY=VALUE pairs, in order: more oktopk::Options fields.
  std::vector<std::pair<std::string, std::string>> options;
  std::uint64_t seed = 1;
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::string text = OKTOPK_TRAIN_DEFAULT_TEXT;
  std::int64_t vocabulary = 10000;
  std::int64_t embedding = 64;
  std::int64_t hidden = 128;
  std::int64_t bptt = 20;
  std::int64_t tokens_per_epoch = lstm_default_tokens_per_epoch;
  std::string csv;
  std::string dump_path;
  std::int64_t dump_steps = 8;
  std::int64_t steps_cap = 0;
  std::string checkpoint;
  std::int64_t checkpoint_every = 0;
  std::string resume;
  bool help = false;
};

/// Whether --momentum-correction applies to the method: to those that select entries and keep
/// the rest as error feedback. Not to dense, for which the update is the same either way,
/// nor to S2, which sketches the rows a step touches: a velocity is non-zero in every row of the
/// last few dozen steps, and the sketch's collisions grow with them (the language model: perplexity
/// 152.79 against 139.60).
bool momentum_correction_applies(oktopk::Algorithm algorithm) {
  return algorithm != oktopk::Algorithm::Dense && algorithm != oktopk::Algorithm::S2Reducer;
}

/// Whether the velocity is kept per rank, before the allreduce.
bool corrects_momentum(const Settings& s) {
  return s.momentum_correction && momentum_correction_applies(s.algorithm);
}

/// Whether the allreduce returns its result in sparse form (--sparse-result): only where the
/// velocity is kept per rank, since momentum applied after the allreduce reads every entry.
bool returns_sparse_result(const Settings& s) {
  return s.sparse_result == "on" || (s.sparse_result.empty() && corrects_momentum(s));
}

/// Settings that checkpoints written before they were recorded had: checkpoints from before
/// --momentum-correction applied momentum after the allreduce.
const std::vector<std::pair<std::string, std::string>> checkpoint_implied = {
    {"--momentum-correction", "off"}};

/// The allreduce's options: density, dense warm-up and seed from their flags, then --option.
oktopk::Options library_options(const Settings& s) {
  oktopk::Options o = oktopk::Options()
                          .set_density(s.density)
                          .set_warmup_iterations(s.dense_warmup)
                          .set_seed(s.seed);
  for (const auto& [key, value] : s.options) o.set(key, value);
  return o;
}

Settings parse(int argc, char* argv[]) {
  Settings s;
  bool batch_given = false;  // otherwise the model's default
  bool lr_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag.rfind("--kokkos-", 0) == 0) continue;  // Kokkos's own
    if (flag == "--help" || flag == "-h") {
      s.help = true;
      continue;
    }
    if (i + 1 >= argc) throw UsageError("unknown option or missing value: " + flag);
    const std::string value = argv[++i];
    if (flag == "--model") {
      s.model = value;
    } else if (flag == "--algo") {
      try {
        s.algorithm = oktopk::algorithm_from_string(value);
      } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
      }
    } else if (flag == "--density") {
      s.density = parse_number<double>(flag, value);
    } else if (flag == "--epochs") {
      s.epochs = parse_number<std::int64_t>(flag, value);
    } else if (flag == "--batch") {
      s.batch = parse_number<std::int64_t>(flag, value);
      batch_given = true;
    } else if (flag == "--lr") {
      s.lr = parse_number<double>(flag, value);
      lr_given = true;
    } else if (flag == "--lr-decay") {
      s.lr_decay = parse_number<double>(flag, value);
    } else if (flag == "--momentum") {
      s.momentum = parse_number<double>(flag, value);
    } else if (flag == "--sparse-result") {
      if (value != "on" && value != "off")
        throw UsageError("--sparse-result must be on or off, not '" + value + "'");
      s.sparse_result = value;
    } else if (flag == "--momentum-correction") {
      if (value != "on" && value != "off")
        throw UsageError("--momentum-correction must be on or off, not '" + value + "'");
      s.momentum_correction = value == "on";
    } else if (flag == "--weight-decay") {
      s.weight_decay = parse_number<double>(flag, value);
    } else if (flag == "--dense-warmup") {
      s.dense_warmup = parse_number<std::int64_t>(flag, value);
    } else if (flag == "--overlap") {
      if (value != "on" && value != "off")
        throw UsageError("--overlap must be on or off, not '" + value + "'");
      s.overlap = value == "on";
    } else if (flag == "--bucket-kib") {
      s.bucket_kib = parse_number<std::int64_t>(flag, value);
    } else if (flag == "--wire") {
      try {
        oktopk::wire_from_string(value.c_str());
      } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
      }
      // An Options field like any other: checkpoints record it with the --option pairs.
      s.options.emplace_back("wire", value);
    } else if (flag == "--option") {
      const auto equals = value.find('=');
      if (equals == std::string::npos)
        throw UsageError("--option needs KEY=VALUE, got '" + value + "'");
      s.options.emplace_back(value.substr(0, equals), value.substr(equals + 1));
    } else if (flag == "--seed") {
      s.seed = parse_number<std::uint64_t>(flag, value);
    } else if (flag == "--data") {
      s.data = value;
    } else if (flag == "--text") {
      s.text = value;
    } else if (flag == "--vocab") {
      s.vocabulary = parse_number<std::int64_t>(flag, value);
    } else if (flag == "--embed") {
      s.embedding = parse_number<std::int64_t>(flag, value);
    } else if (flag == "--hidden") {
      s.hidden = parse_number<std::int64_t>(flag, value);
    } else if (flag == "--bptt") {
      s.bptt = parse_number<std::int64_t>(flag, value);
    } else if (flag == "--tokens-per-epoch") {
      s.tokens_per_epoch = parse_number<std::int64_t>(flag, value);
    } else if (flag == "--csv") {
      s.csv = value;
    } else if (flag == "--dump-gradients") {
      s.dump_path = value;
    } else if (flag == "--dump-steps") {
      s.dump_steps = parse_number<std::int64_t>(flag, value);
    } else if (flag == "--steps-per-epoch") {
      s.steps_cap = parse_number<std::int64_t>(flag, value);
    } else if (flag == "--checkpoint") {
      s.checkpoint = value;
    } else if (flag == "--checkpoint-every") {
      s.checkpoint_every = parse_number<std::int64_t>(flag, value);
    } else if (flag == "--resume") {
      s.resume = value;
    } else {
      throw UsageError("unknown option " + flag);
    }
  }
  const auto names = oktopk::train::model_names();
  const bool language = s.model == "lstm";
  if (!language && std::find(names.begin(), names.end(), s.model) == names.end()) {
    throw UsageError("unknown --model '" + s.model + "' (valid: mlp cnn lstm)");
  }
  if (!(s.density >= 0.0 && s.density <= 1.0)) throw UsageError("--density must be in [0, 1]");
  if (s.epochs < 1) throw UsageError("--epochs must be at least 1");
  if (batch_given && s.batch < 1) throw UsageError("--batch must be at least 1");
  if (!batch_given) s.batch = language ? lstm_default_batch : 64;
  if (lr_given && !(s.lr > 0.0)) throw UsageError("--lr must be positive");
  if (!lr_given) s.lr = language ? lstm_default_lr : 0.05;
  if (s.vocabulary < 3) throw UsageError("--vocab must be at least 3");
  if (s.embedding < 1) throw UsageError("--embed must be at least 1");
  if (s.hidden < 1) throw UsageError("--hidden must be at least 1");
  if (s.bptt < 1) throw UsageError("--bptt must be at least 1");
  if (s.tokens_per_epoch < 0) throw UsageError("--tokens-per-epoch must be >= 0");
  if (!(s.lr_decay > 0.0 && s.lr_decay <= 1.0)) throw UsageError("--lr-decay must be in (0, 1]");
  if (!(s.momentum >= 0.0 && s.momentum < 1.0)) throw UsageError("--momentum must be in [0, 1)");
  if (s.sparse_result == "on" && !corrects_momentum(s)) {
    throw UsageError(
        "--sparse-result on needs momentum correction (--momentum-correction on, and a method "
        "other than dense and s2): momentum applied after the allreduce updates every entry");
  }
  if (!(s.weight_decay >= 0.0)) throw UsageError("--weight-decay must be >= 0");
  if (s.dense_warmup < 0) throw UsageError("--dense-warmup must be >= 0");
  oktopk::Options options;
  try {
    options = library_options(s);
    options.validate();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (s.overlap) {
    if (s.algorithm != oktopk::Algorithm::Dense)
      throw UsageError("--overlap on needs --algo dense");
    if (!language) {
      throw UsageError(
          "--overlap on needs --model lstm (the classifiers' backward pass does not report its "
          "finished layers)");
    }
    if (options.wire == oktopk::Wire::Float16) {
      throw UsageError("--overlap on sends float32 or bfloat16 values, not --wire fp16");
    }
    if (!s.dump_path.empty())
      throw UsageError("--overlap on cannot be combined with --dump-gradients");
    if (options.dense_allreduce == oktopk::DenseAlgorithm::Ring || options.hierarchical) {
      throw UsageError(
          "--overlap on sums with MPI_Iallreduce: the dense_allreduce and hierarchical options "
          "do not apply");
    }
    if (!Kokkos::SpaceAccessibility<Kokkos::HostSpace, Memory>::accessible) {
      throw UsageError("--overlap on needs a host build (MPI reads the gradient directly)");
    }
  }
  if (s.bucket_kib < 1) throw UsageError("--bucket-kib must be at least 1");
  if (s.dump_steps < 1) throw UsageError("--dump-steps must be at least 1");
  if (s.steps_cap < 0) throw UsageError("--steps-per-epoch must be >= 0");
  if (s.checkpoint_every < 0) throw UsageError("--checkpoint-every must be >= 0");
  if (s.checkpoint_every > 0 && s.checkpoint.empty()) {
    throw UsageError("--checkpoint-every needs --checkpoint FILE");
  }
  if (!s.resume.empty() && !s.dump_path.empty()) {
    throw UsageError("--dump-gradients cannot be combined with --resume");
  }
  return s;
}

/// Rank 0 writes gradients as oktopk-bench's file:PATH reads them (common/gradient_file.hpp),
/// step by step and, within a step, rank by rank.
class GradientDump {
 public:
  GradientDump(const oktopk::Communicator& comm, const std::string& path, std::int64_t n,
               std::int64_t steps)
      : comm_(comm), n_(n), steps_(steps) {
    if (path.empty()) return;
    int ok = 1;
    if (comm.rank() == 0) ok = file_.open(path, {n_, steps * comm.size()}) ? 1 : 0;
    comm.bcast(&ok, 1, 0);
    if (ok == 0) throw std::runtime_error("cannot write --dump-gradients " + path);
    active_ = true;
  }

  /// Collective while active: gathers this step's local gradients to rank 0.
  void record(const Exec& exec, std::int64_t step, const Kokkos::View<float*, Memory>& grad) {
    if (!active_ || step >= steps_) return;
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grad);
    exec.fence();
    const int P = comm_.size();
    std::vector<int> counts(P, static_cast<int>(n_));
    std::vector<int> displacements(P);
    for (int r = 0; r < P; ++r) displacements[r] = static_cast<int>(r * n_);
    // Every rank receives everything through allgatherv; only rank 0 needs it, but the
    // gradients are small and the communicator has no gather.
    std::vector<float> gathered(static_cast<std::size_t>(n_) * P);
    comm_.allgatherv(host.data(), n_, gathered.data(), counts.data(), displacements.data());
    if (comm_.rank() == 0) {
      file_.write(gathered.data(), gathered.size());
      if (step + 1 == steps_) file_.close();
    }
  }

 private:
  oktopk::Communicator comm_;
  std::int64_t n_;
  std::int64_t steps_;
  bool active_ = false;
  oktopk::apps::GradientFileWriter file_;
};

/// The settings a resumed run must repeat: everything that shapes the sequence of steps.
std::vector<std::pair<std::string, std::string>> training_settings(
    const Settings& s, const oktopk::train::TrainingTask& task, std::int64_t n, std::int64_t steps,
    int P) {
  auto exact = [](double v) {
    std::ostringstream os;
    os.precision(17);
    os << v;
    return os.str();
  };
  std::vector<std::pair<std::string, std::string>> settings = {
      {"--model", s.model},
      {"--algo", oktopk::to_string(s.algorithm)},
      {"--density", exact(s.density)},
      {"--batch", std::to_string(s.batch)},
      {"--lr", exact(s.lr)},
      {"--lr-decay", exact(s.lr_decay)},
      {"--momentum", exact(s.momentum)},
      {"--weight-decay", exact(s.weight_decay)},
      {"--dense-warmup", std::to_string(s.dense_warmup)},
      {"--seed", std::to_string(s.seed)},
      {"ranks", std::to_string(P)},
      {"parameters", std::to_string(n)},
      {"training samples", std::to_string(task.training_samples())},
      {"steps per epoch", std::to_string(steps)}};
  // Only where it changes the update (checkpoint_implied gives old checkpoints' value).
  if (momentum_correction_applies(s.algorithm))
    settings.emplace_back("--momentum-correction", s.momentum_correction ? "on" : "off");
  // Only when on, so that checkpoints written before it existed still match.
  if (s.overlap) {
    settings.emplace_back("--overlap", "on");
    settings.emplace_back("--bucket-kib", std::to_string(s.bucket_kib));
  }
  // The language model's own settings: none for the classifiers, so their checkpoints written
  // before the language model existed still match.
  for (const auto& setting : task.checkpoint_settings()) settings.push_back(setting);
  // Only when given, so that checkpoints written without them still match.
  for (const auto& [key, value] : s.options) settings.emplace_back("--option", key + "=" + value);
  return settings;
}

std::vector<float> to_host_vector(const Kokkos::View<float*, Memory>& v) {
  std::vector<float> host(v.extent(0));
  Kokkos::deep_copy(
      Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(host.data(),
                                                                                       host.size()),
      v);
  return host;
}

void from_host_vector(const Exec& exec, const std::vector<float>& host,
                      const Kokkos::View<float*, Memory>& v) {
  Kokkos::deep_copy(
      exec, v,
      Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
          host.data(), host.size()));
  exec.fence();  // `host` may go out of scope
}

/// A digest of the parameters' bytes: equal on every rank exactly when the models are equal.
std::int64_t parameter_digest(const Kokkos::View<float*, Memory>& params) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), params);
  return oktopk::agreement_digest(
      std::string_view(reinterpret_cast<const char*>(host.data()), host.size() * sizeof(float)));
}

int run(const Settings& s, const oktopk::Communicator& comm) {
  using namespace oktopk::train;
  const int P = comm.size();
  const int me = comm.rank();
  Exec exec;
  auto say = [&](const std::string& line) {
    if (me == 0) std::cout << line << std::endl;
  };

  std::unique_ptr<TrainingTask> task;
  if (s.model == "lstm") {
    LanguageTaskSettings language;
    language.text = s.text;
    language.shape = {s.vocabulary, s.embedding, s.hidden};
    language.steps = s.bptt;
    language.batch = s.batch;
    language.tokens_per_epoch = s.tokens_per_epoch;
    language.seed = s.seed;
    task = make_language_task(exec, language, me, P);
  } else {
    task = make_classifier_task(exec, s.model, s.seed, s.data, s.batch, me, P);
  }
  std::int64_t steps = task->steps_per_epoch();
  if (s.steps_cap > 0) steps = std::min(steps, s.steps_cap);
  if (steps < 1) throw std::runtime_error("--batch is larger than a rank's shard");

  const auto params = task->parameters();
  const auto grad = task->gradient();
  const auto n = static_cast<std::int64_t>(params.extent(0));
  const oktopk::Options options = library_options(s);
  // A model with an embedding hands its layout to the allreduce: S2 sketches the embedding's
  // rows alone and averages the rest exactly, the other methods report per-segment counts.
  // Models without one keep the plain handle (and its checkpoint format).
  const auto segments = gradient_segments(task->parameter_blocks());
  oktopk::Layout layout;
  if (std::any_of(segments.begin(), segments.end(),
                  [](const GradientSegment& g) { return g.is_sparse_rows; })) {
    for (const auto& segment : segments) {
      if (segment.is_sparse_rows) {
        layout.append_sparse_rows(segment.length, segment.row_width, segment.name);
      } else {
        layout.append_dense(segment.length, segment.name);
      }
    }
  }
  auto allreduce = oktopk::make_sparse_allreduce<Exec>(s.algorithm, comm, n, options, layout);

  std::ostringstream head;
  head << "# oktopk-train: model=" << task->describe() << " algo=" << oktopk::to_string(s.algorithm)
       << " P=" << P << " batch/rank=" << s.batch << " steps/epoch=" << steps << " lr=" << s.lr
       << " lr_decay=" << s.lr_decay << " momentum=" << s.momentum
       << (corrects_momentum(s) ? " (per rank, before the allreduce)" : " (after the allreduce)")
       << " result=" << (returns_sparse_result(s) ? "sparse" : "dense")
       << (s.overlap ? " overlap=on (MPI_Iallreduce per bucket during backprop)" : "")
       << " weight_decay=" << s.weight_decay << " seed=" << s.seed << " exec=" << Exec::name()
       << "\n# options: " << options << "\n# gradient segments:";
  // Where the embedding's row-sparse gradient lies, for a layout-aware allreduce.
  const char* separator = " ";
  for (const auto& segment : segments) {
    head << separator << segment.name << " [" << segment.offset << ", "
         << segment.offset + segment.length << ")";
    if (segment.is_sparse_rows) head << " sparse rows of " << segment.row_width;
    separator = "; ";
  }
  say(head.str());

  // The averaged gradient: n entries, or its entries alone (--sparse-result).
  const bool sparse_result = returns_sparse_result(s);
  Kokkos::View<float*, Memory> averaged("oktopk::train::averaged", sparse_result ? 0 : n);
  oktopk::SparseResult<Memory> averaged_entries;
  Kokkos::View<float*, Memory> velocity("oktopk::train::velocity", n);
  std::unique_ptr<OverlappedDenseAllreduce> overlapped;
  if (s.overlap) {
    overlapped = std::make_unique<OverlappedDenseAllreduce>(
        comm, n,
        options.wire == oktopk::Wire::BFloat16 ? OverlappedDenseAllreduce::Values::BFloat16
                                               : OverlappedDenseAllreduce::Values::Float32,
        s.bucket_kib * 1024 / 4);
  }

  // Resuming: the checkpoint replaces the model, the momentum, the allreduce state and the
  // position; the shuffles are functions of (seed, rank, epoch), so nothing else is needed.
  const auto settings = training_settings(s, *task, n, steps, P);
  // Ranks started with other flags (an MPMD launch, a script that differs per host) would train
  // apart in silence until the first epoch's parameter check: every rank reports it now.
  {
    std::string joined;
    for (const auto& [name, value] : settings) joined += name + "=" + value + "\n";
    comm.check_agreement("the command line", {{"the digest of the training settings",
                                               oktopk::agreement_digest(joined)}});
  }
  oktopk::train::TrainingProgress progress;
  progress.lr = s.lr;
  if (!s.resume.empty()) {
    const oktopk::train::TrainingCheckpoint checkpoint =
        oktopk::train::load_checkpoint(comm, s.resume, settings, checkpoint_implied);
    from_host_vector(exec, checkpoint.parameters, params);
    from_host_vector(exec, checkpoint.velocity, velocity);
    std::istringstream state(checkpoint.allreduce_state);
    allreduce->restore_state(exec, state);
    progress = checkpoint.progress;
    comm.check_agreement(("--resume " + s.resume).c_str(),
                         {{"model parameters", parameter_digest(params)}});
    if (progress.epoch > s.epochs + 1) {
      throw std::runtime_error("--resume " + s.resume + ": the checkpoint is after epoch " +
                               std::to_string(progress.epoch - 1) + ", beyond --epochs " +
                               std::to_string(s.epochs));
    }
    std::ostringstream line;
    line << "# resumed from " << oktopk::train::checkpoint_file(s.resume, me) << ": epoch "
         << progress.epoch << " step " << progress.step << " (" << progress.global_step
         << " steps taken)";
    say(line.str());
  }
  auto save = [&](const oktopk::train::TrainingProgress& at) {
    oktopk::train::TrainingCheckpoint checkpoint;
    checkpoint.settings = settings;
    checkpoint.rank = me;
    checkpoint.ranks = P;
    checkpoint.progress = at;
    exec.fence();
    checkpoint.parameters = to_host_vector(params);
    checkpoint.velocity = to_host_vector(velocity);
    std::ostringstream state;
    allreduce->save_state(exec, state);
    checkpoint.allreduce_state = state.str();
    oktopk::train::save_checkpoint(comm, s.checkpoint, checkpoint);
    std::ostringstream line;
    line << "# checkpoint " << oktopk::train::checkpoint_file(s.checkpoint, me)
         << " written: epoch " << at.epoch << " step " << at.step << " (" << at.global_step
         << " steps taken)";
    say(line.str());
  };

  std::ofstream csv;
  if (!s.csv.empty()) {
    // Only rank 0 writes, but every rank must stop if it cannot. A resumed run appends.
    int ok = 1;
    if (me == 0) {
      csv.open(s.csv, s.resume.empty() ? std::ios::trunc : std::ios::app);
      if (s.resume.empty() || csv.tellp() == 0) {
        csv << "epoch,train_loss," << task->metric_name()
            << ",seconds,bytes_per_rank_per_step,density\n";
      }
      ok = csv.good() ? 1 : 0;
    }
    comm.bcast(&ok, 1, 0);
    if (ok == 0) throw std::runtime_error("cannot write --csv " + s.csv);
  }
  const bool perplexity = task->metric_name() == "test_ppl";
  say(perplexity ? "epoch  train_loss  test_ppl         seconds  bytes_per_rank_per_step  density"
                 : "epoch  train_loss  test_acc   seconds  bytes_per_rank_per_step  density");
  // The dump's header counts its gradients: no more steps than the run will take.
  GradientDump dump(comm, s.dump_path, n, std::min(s.dump_steps, s.epochs * steps));

  double final_metric = progress.final_accuracy;
  double lr = progress.lr;
  std::int64_t global_step = progress.global_step;
  for (std::int64_t epoch = progress.epoch; epoch <= s.epochs; ++epoch) {
    task->begin_epoch(exec, epoch);
    comm.barrier();
    Kokkos::Timer timer;
    Kokkos::Timer progress_timer;
    const bool resumed = epoch == progress.epoch;  // from progress.step, with its sums so far
    double loss_sum = resumed ? progress.loss_sum : 0.0;
    double bytes_sum = resumed ? progress.bytes_sum : 0.0;
    double density_sum = resumed ? progress.density_sum : 0.0;
    for (std::int64_t step = resumed ? progress.step : 0; step < steps; ++step, ++global_step) {
      std::int64_t nonzeros = 0;
      if (overlapped) {
        // Dense (momentum applied after the allreduce), its sums launched during backprop.
        overlapped->begin_step();
        loss_sum += task->train_step(
            exec, step, [&](std::int64_t from) { overlapped->ready(exec, grad, averaged, from); });
        overlapped->finish(exec, grad, averaged);
        sgd_momentum_step<float>(exec, params, averaged, velocity, lr, s.momentum, s.weight_decay);
        nonzeros = oktopk::count_above(exec, averaged, 0.0f);
        bytes_sum += overlapped->bytes_per_step();
      } else {
        loss_sum += task->train_step(exec, step, {});
        // With momentum correction the allreduce averages velocities, and the dump records
        // what the allreduce is given.
        const bool correct_momentum = corrects_momentum(s);
        if (correct_momentum) {
          oktopk::train::accumulate_velocity<float>(exec, params, grad, velocity, s.momentum,
                                                    s.weight_decay);
        }
        const Kokkos::View<float*, Memory> reduced = correct_momentum ? velocity : grad;
        dump.record(exec, global_step, reduced);
        if (sparse_result) {
          allreduce->reduce_sparse(exec, reduced, averaged_entries);
          oktopk::train::sgd_apply_sparse(exec, params, averaged_entries.indices,
                                          averaged_entries.values, averaged_entries.size, lr);
          nonzeros = averaged_entries.size;
        } else {
          allreduce->reduce(exec, reduced, averaged);
          if (correct_momentum) {
            oktopk::train::sgd_apply<float>(exec, params, averaged, lr);
          } else {
            sgd_momentum_step<float>(exec, params, averaged, velocity, lr, s.momentum,
                                     s.weight_decay);
          }
          nonzeros = oktopk::count_above(exec, averaged, 0.0f);
        }
        const oktopk::PhaseTraffic traffic = allreduce->stats().total_traffic();
        bytes_sum += static_cast<double>(std::max(traffic.bytes_sent, traffic.bytes_received));
      }
      density_sum += static_cast<double>(nonzeros) / n;
      if (me == 0 && progress_timer.seconds() > 10.0) {
        std::cerr << "oktopk-train: epoch " << epoch << " step " << step + 1 << "/" << steps
                  << ", loss " << loss_sum / (step + 1) << ", " << timer.seconds() << " s"
                  << std::endl;
        progress_timer.reset();
      }
      // Mid-epoch checkpoints; one that falls on the epoch's last step is taken after it.
      if (s.checkpoint_every > 0 && (global_step + 1) % s.checkpoint_every == 0 &&
          step + 1 < steps) {
        save(
            {epoch, step + 1, global_step + 1, lr, loss_sum, bytes_sum, density_sum, final_metric});
      }
    }
    exec.fence();
    const double seconds = timer.seconds();

    lr *= s.lr_decay;
    final_metric = task->test_metric(exec, comm);
    double sums[2] = {loss_sum / steps, bytes_sum / steps};
    comm.allreduce_in_place(sums, 2, MPI_SUM);
    const double train_loss = sums[0] / P;
    const double bytes = sums[1] / P;
    const double density = density_sum / steps;  // the averaged gradient is the same everywhere

    const std::int64_t digest = parameter_digest(params);
    comm.check_agreement("oktopk-train", {{"model parameters", digest}});

    char line[256];
    if (perplexity) {
      std::snprintf(line, sizeof line, "%5lld  %10.4f  ppl=%-11.2f  %8.2f  %23.0f  %7.5f",
                    static_cast<long long>(epoch), train_loss, final_metric, seconds, bytes,
                    density);
    } else {
      std::snprintf(line, sizeof line, "%5lld  %10.4f  %8.4f  %8.2f  %23.0f  %7.5f",
                    static_cast<long long>(epoch), train_loss, final_metric, seconds, bytes,
                    density);
    }
    say(line);
    if (csv.is_open()) {
      csv << epoch << "," << train_loss << "," << final_metric << "," << seconds << "," << bytes
          << "," << density << "\n";
      csv.flush();  // a run stopped after a checkpoint keeps its rows
    }
    if (!s.checkpoint.empty() &&
        (s.checkpoint_every == 0 || global_step % s.checkpoint_every == 0)) {
      save({epoch + 1, 0, global_step, lr, 0.0, 0.0, 0.0, final_metric});
    }
  }
  say("final " + task->metric_name() + "=" + task->format_metric(final_metric) +
      " (parameters identical on all " + std::to_string(P) + " ranks)");
  char digest_line[64];
  std::snprintf(digest_line, sizeof digest_line, "final parameter_digest=%016llx",
                static_cast<unsigned long long>(parameter_digest(params)));
  say(digest_line);
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int status = 0;
  // Every rank parses the same arguments, so every rank takes the same branch: no hang.
  Settings settings;
  try {
    settings = parse(argc, argv);
  } catch (const UsageError& e) {
    if (rank == 0) std::cerr << "oktopk-train: " << e.what() << " (see --help)\n";
    MPI_Finalize();
    return 2;
  }
  if (settings.help) {
    if (rank == 0) std::cout << usage;
    MPI_Finalize();
    return 0;
  }
  {
    oktopk::apps::FailureSettlement failures("oktopk-train");
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      const oktopk::Communicator comm(MPI_COMM_WORLD);
      status = run(settings, comm);
    } catch (const std::exception& e) {
      const std::string cause = oktopk::apps::failure_cause(e);
      // Errors that depend on the data (missing files) hit every rank alike: reported once.
      // One that hit this rank alone ends the job here, with this rank's number.
      failures.settle(cause);
      if (rank == 0) std::cerr << "oktopk-train: " << cause << "\n";
      status = 1;
    }
  }
  MPI_Finalize();
  return status;
}
