// Builds one JavaScript plugin into a WebAssembly component with componentize-js, through its
// JavaScript API (the `jco componentize` command of this release cannot read its input files).
// Called by build.sh, which installs the tools and stages the sources:
//
//   node build.mjs TOOLS_DIR SOURCE.js WIT_DIR WORLD OUT.wasm

import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [tools, sourcePath, witPath, worldName, out] = process.argv.slice(2);
if (!out) {
  console.error('usage: node build.mjs TOOLS_DIR SOURCE.js WIT_DIR WORLD OUT.wasm');
  process.exit(2);
}

// The tools live outside the clone, so the package is loaded by path rather than by name.
const entry = join(tools, 'node_modules/@bytecodealliance/componentize-js/src/componentize.js');
const { componentize } = await import(pathToFileURL(entry).href);

const { component } = await componentize({
  sourcePath,
  witPath,
  worldName,
  // What the engine may import beyond the world. Kept: stdio, so that an uncaught exception
  // reaches the host's captured stderr. Left out: fetch and the incoming-HTTP handler (they
  // import wasi:http, which the host does not link), clocks (a plugin's clock is the batch
  // timestamp) and random (the host's seeded `random-u64` replays; Math.random is then
  // deterministic too).
  disableFeatures: ['http', 'fetch-event', 'clocks', 'random'],
});
await writeFile(out, component);
