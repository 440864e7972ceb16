// Reference tokenizers for Zettatron's data tests: JavaScript implementations
// that Zettatron did not write, run under node on the same inputs.
//
//   node reference_encode.mjs IMPL INPUT OUTPUT CACHE_DIR [RANK_FILE]
//
// INPUT: records [u32 byte length][UTF-8 bytes]...; OUTPUT: one record per
// input, [u32 count][u32 values...] (little-endian). IMPL:
//   gpt3-encoder           gpt-3-encoder's encode (GPT-2; special strings are text)
//   llama3-js              llama3-tokenizer-js, no BOS/EOS, special strings are text
//   llama3-js-special      llama3-tokenizer-js, no BOS/EOS, special strings -> ids
//   tiktoken-gpt2          tiktoken (WASM build of OpenAI's Rust tiktoken), gpt2, encode_ordinary
//   tiktoken-gpt2-special  the same with allowed_special = "all"
//   tiktoken-llama3        tiktoken's core with RANK_FILE, Llama 3's pattern and special tokens
//   pieces-gpt2            byte lengths of the pieces of GPT-2's pattern (gpt-3-encoder's regex)
//   pieces-llama3          byte lengths of the pieces of Llama 3's pattern (llama3-tokenizer-js's regex)
//   classes                INPUT ignored; OUTPUT one record of 0x110000 values, the class
//                          of each code point: 0 \p{L}, 1 \p{N}, 2 \s, 3 other (surrogates: 3)
// The packages are the ones scripts/fetch_vocab.sh installs into CACHE_DIR/npm.
// Exit code 3: a package is missing (the message says how to install it).
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const [impl, input, output, cacheDir, rankFile] = process.argv.slice(2);
if (!impl || !output || !cacheDir) {
  console.error('usage: node reference_encode.mjs IMPL INPUT OUTPUT CACHE_DIR [RANK_FILE]');
  process.exit(2);
}
const npmDir = path.join(cacheDir, 'npm');
const require = createRequire(path.join(npmDir, 'package.json'));
function resolvePackage(name) {
  try {
    return require.resolve(name);
  } catch (e) {
    console.error(`reference package '${name}' is not installed in ${npmDir}: run \`make deps\` (scripts/fetch_vocab.sh)`);
    process.exit(3);
  }
}

function readRecords(file) {
  const buf = fs.readFileSync(file);
  const decoder = new TextDecoder('utf-8', { ignoreBOM: true });  // keep a leading U+FEFF
  const out = [];
  for (let off = 0; off < buf.length;) {
    const n = buf.readUInt32LE(off);
    off += 4;
    out.push(decoder.decode(buf.subarray(off, off + n)));
    off += n;
  }
  return out;
}

function writeRecords(file, lists) {
  let total = 0;
  for (const l of lists) total += 4 + 4 * l.length;
  const buf = Buffer.alloc(total);
  let off = 0;
  for (const l of lists) {
    buf.writeUInt32LE(l.length, off);
    off += 4;
    for (const v of l) {
      if (!Number.isInteger(v) || v < 0) throw new Error(`reference produced a non-id value ${v}`);
      buf.writeUInt32LE(v, off);
      off += 4;
    }
  }
  fs.writeFileSync(file, buf);
}

const utf8 = new TextEncoder();
const pieceLengths = (text, re) => Array.from(text.matchAll(re), (m) => utf8.encode(m[0]).length);

// The patterns exactly as the reference packages use them.
const GPT2_PATTERN = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
const LLAMA3_PATTERN_JS = new RegExp(
  "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
  'gu');
// Meta's pattern in tiktoken (Rust fancy-regex) syntax.
const LLAMA3_PATTERN_TIKTOKEN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

async function llama3() {
  const mod = await import(pathToFileURL(resolvePackage('llama3-tokenizer-js')).href);
  return mod.default;
}

if (impl === 'classes') {
  const L = /^\p{L}$/u, N = /^\p{N}$/u, S = /^\s$/u;
  const out = new Array(0x110000);
  for (let cp = 0; cp <= 0x10ffff; ++cp) {
    if (cp >= 0xd800 && cp <= 0xdfff) { out[cp] = 3; continue; }
    const c = String.fromCodePoint(cp);
    out[cp] = L.test(c) ? 0 : N.test(c) ? 1 : S.test(c) ? 2 : 3;
  }
  writeRecords(output, [out]);
  process.exit(0);
}

const docs = readRecords(input);
let encode;
switch (impl) {
  case 'gpt3-encoder': {
    const g = require(resolvePackage('gpt-3-encoder'));
    encode = (t) => g.encode(t);
    break;
  }
  case 'llama3-js': {
    const t = await llama3();
    encode = (s) => t.encode(s, { bos: false, eos: false, specialTokenRegex: /(?!)/g });
    break;
  }
  case 'llama3-js-special': {
    const t = await llama3();
    encode = (s) => t.encode(s, { bos: false, eos: false });
    break;
  }
  case 'tiktoken-gpt2':
  case 'tiktoken-gpt2-special': {
    const { get_encoding } = require(resolvePackage('tiktoken'));
    const enc = get_encoding('gpt2');
    encode = impl === 'tiktoken-gpt2' ? (s) => Array.from(enc.encode_ordinary(s))
                                      : (s) => Array.from(enc.encode(s, 'all'));
    break;
  }
  case 'tiktoken-llama3': {
    if (!rankFile) { console.error('tiktoken-llama3 needs RANK_FILE'); process.exit(2); }
    const { Tiktoken } = require(resolvePackage('tiktoken'));
    const t = await llama3();
    const specials = {};
    for (let id = 128000; id < t.vocabById.length; ++id) specials[t.vocabById[id]] = id;
    const enc = new Tiktoken(fs.readFileSync(rankFile, 'utf8'), specials, LLAMA3_PATTERN_TIKTOKEN);
    encode = (s) => Array.from(enc.encode_ordinary(s));
    break;
  }
  case 'pieces-gpt2':
    encode = (s) => pieceLengths(s, GPT2_PATTERN);
    break;
  case 'pieces-llama3':
    encode = (s) => pieceLengths(s, LLAMA3_PATTERN_JS);
    break;
  default:
    console.error(`unknown IMPL '${impl}'`);
    process.exit(2);
}
writeRecords(output, docs.map((d) => encode(d)));
