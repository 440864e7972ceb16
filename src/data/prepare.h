// `zettatron prepare`: text files -> tokenised, checksummed shards + index.json.
//
//   inputs (files and folders, folders searched recursively in path order;
//   hidden files, symbolic links, empty and binary files inside folders are
//   skipped and counted) -> documents (see DocSplit) -> each document
//   tokenised on `threads` threads, followed by the end-of-text token ->
//   document i goes to the validation split when floor((i+1) f) > floor(i f)
//   (an exact, evenly spread fraction f of the documents, independent of the
//   thread count) -> shards of `shard_tokens` tokens per split (a document
//   may continue in the next shard) -> index.json (data/dataset_index.h).
//
// Everything is written into OUTPUT.tmp-<pid> and renamed to OUTPUT at the
// end; a failure removes the temporary folder, so OUTPUT is either absent or
// complete. The output is byte-identical for any thread count.
#pragma once

#include <cstdint>
#include <deque>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset_index.h"
#include "data/tokenizer.h"

namespace zt::data {

// How a file is cut into documents.
enum class DocSplit {
  automatic,  // "auto": jsonl for *.jsonl files, whole file otherwise
  file,       // the whole file is one document
  percent,    // fortune files: documents separated by lines holding only "%"
  blank,      // paragraphs: documents separated by one or more blank lines
  line,       // every line is a document (without its line break)
  jsonl,      // every line is a JSON object; the document is its "text" string
};
DocSplit parse_doc_split(std::string_view s);  // throws zt::Error listing the names
const char* doc_split_name(DocSplit s);

struct PrepareOptions {
  std::string tokenizer = "gpt2";   // gpt2 | llama3 | PATH (see load_tokenizer)
  std::vector<std::string> inputs;  // files and folders
  std::string output;               // dataset folder to create
  double val_fraction = 0.01;       // fraction of documents for the validation split, [0, 1)
  uint64_t shard_tokens = 100'000'000;  // tokens per shard file
  DocSplit doc_split = DocSplit::automatic;
  int threads = 0;                  // tokeniser threads; 0 = all cores
  bool force = false;               // replace an existing OUTPUT
  bool progress = true;             // progress bar on the log stream
  void validate() const;            // throws zt::Error for a bad option
};

struct PrepareSummary {
  std::string output;               // the dataset folder
  uint64_t files = 0, bytes = 0;    // input files read and their size
  uint64_t documents = 0;           // documents tokenised (empty ones are skipped)
  uint64_t skipped_files = 0;       // hidden, linked, empty or binary files in input folders
  uint64_t invalid_utf8_documents = 0;  // documents that are not valid UTF-8 (encoded byte by byte)
  SplitInfo train, val;
  double seconds = 0;
};

// Loads opt.tokenizer and prepares. Progress and the summary go to `log`
// (null: silent).
PrepareSummary prepare(const PrepareOptions& opt, std::ostream* log);
// The same with an already loaded tokenizer.
PrepareSummary prepare(const PrepareOptions& opt, const Tokenizer& tokenizer, std::ostream* log);

// Cuts `text` into documents (views into `text`, or into `storage` for jsonl).
// White-space-only documents are dropped. `file` names the file in errors.
std::vector<std::string_view> split_documents(std::string_view text, DocSplit mode, const std::string& file,
                                              std::deque<std::string>& storage);

}  // namespace zt::data
