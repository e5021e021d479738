// merge_datasets: concatenates every .bin/.idx dataset of a folder into one (Megatron-LM's
// tools/merge_datasets.py).
//
//   merge_datasets --input data/parts --output-prefix data/merged [--multimodal]
//
// Same flags, same choice and order of inputs, same output bytes as Megatron's script
// (docs/preprocess_data.md, "Merging datasets"): every regular file of --input names a prefix
// (its name without the last extension, Python's os.path.splitext); each prefix needs both
// <prefix>.bin and <prefix>.idx; the prefixes are merged in Python's sorted() order (code points
// of the names as os.listdir decodes them); the output dtype is the first dataset's and every
// other dataset must have the same; the output .bin is the inputs' .bin files back to back and
// the .idx their sequence lengths, pointers recomputed from 0 (int64) and document indices
// shifted. Megatron prints nothing on success; neither do we.
//
// Stricter than Megatron (each a one-line error, exit 1, nothing written): an --input without any
// dataset (Megatron: AttributeError), an input whose .bin size differs from what its .idx
// describes (Megatron copies it and writes wrong pointers), an --output-prefix that is one of the
// inputs (Megatron truncates that input before reading it). The output is written to temporary
// names and renamed: an error (e.g. a full disk) leaves no partial or temporary file behind.
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "megatron/core/datasets/indexed_dataset.h"
#include "megatron/core/utils/errors.h"
#include "megatron/training/arg_utils.h"

namespace fs = std::filesystem;
namespace ds = megatron::datasets;
using megatron::user_error;

namespace {

// Python's os.path.splitext on a base name: the last '.' starts the extension unless only dots
// precede it (".bashrc" and "..x" have none).
std::pair<std::string, std::string> splitext(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return {name, ""};
  for (size_t i = 0; i < dot; ++i)
    if (name[i] != '.') return {name.substr(0, dot), name.substr(dot)};
  return {name, ""};
}

// The code points Python gives a file name (os.listdir: UTF-8 with surrogateescape, so each byte
// of an invalid sequence becomes U+DC80..U+DCFF), which sorted() compares.
std::vector<uint32_t> python_code_points(const std::string& s) {
  std::vector<uint32_t> out;
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  auto cont = [&](size_t i) { return i < n && (b[i] & 0xC0) == 0x80; };
  for (size_t i = 0; i < n;) {
    const unsigned c = b[i];
    uint32_t cp = 0;
    size_t len = 0;
    if (c < 0x80) {
      cp = c, len = 1;
    } else if (c >= 0xC2 && c <= 0xDF && cont(i + 1)) {
      cp = (c & 0x1F) << 6 | (b[i + 1] & 0x3F), len = 2;
    } else if (c >= 0xE0 && c <= 0xEF && cont(i + 1) && cont(i + 2)) {
      cp = (c & 0x0F) << 12 | (b[i + 1] & 0x3F) << 6 | (b[i + 2] & 0x3F), len = 3;
      if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) len = 0;  // overlong or a surrogate
    } else if (c >= 0xF0 && c <= 0xF4 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
      cp = (c & 0x07) << 18 | (b[i + 1] & 0x3F) << 12 | (b[i + 2] & 0x3F) << 6 | (b[i + 3] & 0x3F), len = 4;
      if (cp < 0x10000 || cp > 0x10FFFF) len = 0;
    }
    if (len == 0) cp = 0xDC00 + c, len = 1;  // surrogateescape
    out.push_back(cp);
    i += len;
  }
  return out;
}

bool is_regular_file(const std::string& p) {  // os.path.isfile: follows symlinks
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int run(int argc, char** argv) {
  CLI::App app{"Merge every .bin/.idx dataset of a folder into one (Megatron-LM tools/merge_datasets.py)",
               "merge_datasets"};
  std::string input, output_prefix;
  bool multimodal = false;
  app.add_option("--input", input, "Path to directory containing all document files to merge")->required();
  app.add_option("--output-prefix", output_prefix, "Path to binary output file without suffix")->required();
  app.add_flag("--multimodal", multimodal, "Whether the datasets are assumed to be multimodal");
  if (!megatron::training::parse_args(app, argc, argv)) return 0;

  if (!fs::is_directory(input)) user_error("--input ", input, " is not a directory or does not exist");
  // Megatron requires a folder part in --output-prefix; a bare name here means the current folder.
  const std::string out_dir = fs::path(output_prefix).parent_path().string();
  if (!out_dir.empty() && !fs::is_directory(out_dir))
    user_error("--output-prefix ", output_prefix, ": ", out_dir, " is not a directory or does not exist");

  std::set<std::string> prefixes;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(input, ec)) {
    const std::string base = e.path().filename().string();
    const auto [prefix, ext] = splitext(base);
    if (prefixes.count(prefix)) continue;
    const std::string path = (fs::path(input) / base).string();
    if (!is_regular_file(path)) continue;
    const std::string stem = (fs::path(input) / prefix).string();
    // Megatron asserts the partner of this file's extension exists, and loading the prefix needs
    // both: name the missing one.
    for (const char* need : {ext == ".idx" ? ".bin" : ".idx", ext == ".idx" ? ".idx" : ".bin"})
      if (!is_regular_file(stem + need))
        user_error("--input ", input, ": ", need, " file not provided for ", stem, " (found ", path,
                   "; every file of the folder must belong to a .bin/.idx pair)");
    prefixes.insert(prefix);
  }
  if (ec) user_error("--input ", input, ": cannot list (", ec.message(), ")");
  if (prefixes.empty()) user_error("--input ", input, ": no .bin/.idx dataset to merge");

  std::vector<std::string> order(prefixes.begin(), prefixes.end());
  std::stable_sort(order.begin(), order.end(), [](const std::string& a, const std::string& b) {
    return python_code_points(a) < python_code_points(b);
  });
  const std::string out_bin = output_prefix + ".bin", out_idx = output_prefix + ".idx";
  for (const auto& p : order) {
    const std::string stem = (fs::path(input) / p).string();
    for (const auto& [in, out] : {std::pair{stem + ".bin", out_bin}, std::pair{stem + ".idx", out_idx}, std::pair{stem + ".bin", out_idx},
                                  std::pair{stem + ".idx", out_bin}})
      if (same_file(in, out))
        user_error("--output-prefix ", output_prefix, ": ", out, " is the input ", in,
                   "; write the merged dataset to another prefix");
  }

  const std::string first = (fs::path(input) / order.front()).string();
  const ds::IndexDType dtype = ds::IndexedDataset(first).dtype();
  ds::IndexedDatasetBuilder builder(out_bin, dtype, multimodal);
  for (const auto& p : order) builder.add_index((fs::path(input) / p).string());
  builder.finalize(out_idx);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const megatron::UserError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 2;
  }
}
