// bench/peer_node_llama.mjs — decode tok/s of llama.cpp through the npm package node-llama-cpp (its
// prebuilt CPU library picks a kernel set for this CPU at run time), for side-by-side runs where the
// prebuilt peers cannot run (bench/decode_compare.sh PEER_NODE=DIR). Not part of the build or the
// tests: DIR is a folder where `npm install node-llama-cpp` ran.
//   node bench/peer_node_llama.mjs DIR MODEL.gguf THREADS N_GEN [N_PROMPT=16]
// Prompt of N_PROMPT token ids, greedy; times the N_GEN decode steps after the first token (the
// first token includes the prompt's prefill). Prints one JSON line with decode_tps.
import path from "node:path";
import {pathToFileURL} from "node:url";

const [dir, model, threads, nGen, nPrompt] = [process.argv[2], process.argv[3], +process.argv[4], +process.argv[5],
                                              +(process.argv[6] || 16)];
if (!dir || !model || !(threads > 0) || !(nGen > 0)) {
    console.error("usage: node bench/peer_node_llama.mjs DIR MODEL.gguf THREADS N_GEN [N_PROMPT]");
    process.exit(2);
}
const entry = path.join(path.resolve(dir), "node_modules", "node-llama-cpp", "dist", "index.js");
const {getLlama} = await import(pathToFileURL(entry).href);
const llama = await getLlama({gpu: false, build: "never", logLevel: "warn"});
const m = await llama.loadModel({modelPath: model});
const ctx = await m.createContext({contextSize: nPrompt + nGen + 16, threads, batchSize: 512});
const seq = ctx.getSequence();
const prompt = Array.from({length: nPrompt}, (_, i) => 100 + ((i * 7919) % 1000));
let n = 0, t0 = 0;
for await (const tok of seq.evaluate(prompt, {temperature: 0})) {
    void tok;
    if (n === 0) t0 = performance.now();
    if (++n > nGen) break;
}
const s = (performance.now() - t0) / 1000;
console.log(JSON.stringify({engine: "llama.cpp via node-llama-cpp", model, threads, n_gen: nGen, decode_tps: nGen / s}));
await ctx.dispose();
await m.dispose();
