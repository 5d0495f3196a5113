// Run Python code on MicroPython's WebAssembly port (npm @micropython/micropython-webassembly-pyscript).
// Usage: node run_micropython.mjs MICROPYTHON_MJS MANIFEST_JSON
// MANIFEST_JSON: {"files": {"/path/in/micropython.py": "/host/path.py", ...}, "code": "..."}
// Prints MicroPython's stdout/stderr; exits 1 when the code raised.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [, , mjs, manifestPath] = process.argv;
const { loadMicroPython } = await import(pathToFileURL(mjs).href);
const manifest = JSON.parse(readFileSync(manifestPath, "utf8"));
const mp = await loadMicroPython({
  heapsize: 16 * 1024 * 1024,
  stdout: (line) => process.stdout.write(line + "\n"),
  stderr: (line) => process.stderr.write(line + "\n"),
});
for (const [target, source] of Object.entries(manifest.files)) {
  const dir = target.substring(0, target.lastIndexOf("/"));
  if (dir) mp.FS.mkdirTree(dir);
  mp.FS.writeFile(target, readFileSync(source));
}
try {
  mp.runPython(manifest.code);
} catch (err) {
  process.stderr.write(String(err && err.message ? err.message : err) + "\n");
  process.exit(1);
}
