// The speed peer for zt_bench_tokenizer: tiktoken (the npm package, a WASM
// build of OpenAI's Rust tokenizer), GPT-2 encoding, encode_ordinary on one
// thread.
//
//   node tiktoken_bench.mjs TEXT_FILE CACHE_DIR REPS
//
// Prints one JSON line: bytes, tokens, best seconds over REPS runs, MB/s and
// a checksum of the ids (sum of (i + 1) * id mod 2^32) to compare with Zettatron's.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const [file, cacheDir, repsArg] = process.argv.slice(2);
const require = createRequire(path.join(cacheDir, 'npm', 'package.json'));
let tiktoken;
try {
  tiktoken = require(require.resolve('tiktoken'));
} catch (e) {
  console.error(`tiktoken is not installed in ${cacheDir}/npm: run \`make deps\` (scripts/fetch_vocab.sh)`);
  process.exit(3);
}
const enc = tiktoken.get_encoding('gpt2');
const bytes = fs.readFileSync(file);
const text = bytes.toString('utf8');
enc.encode_ordinary(text.slice(0, 100000));  // warm up (WASM compilation)
let best = Infinity, ids = null;
for (let r = 0; r < Number(repsArg || 3); ++r) {
  const t0 = process.hrtime.bigint();
  ids = enc.encode_ordinary(text);
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  best = Math.min(best, s);
}
let sum = 0;
for (let i = 0; i < ids.length; ++i) sum = (sum + Math.imul(i + 1, ids[i])) >>> 0;
console.log(JSON.stringify({ bytes: bytes.length, tokens: ids.length, seconds: best,
                             mb_per_s: bytes.length / 1e6 / best, checksum: sum }));
