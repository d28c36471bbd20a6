// Starts `dsv4 serve` on the tiny-a fixture for one test file: 127.0.0.1, a free port (the
// server binds port 0 and prints the one it got), and always stopped: by stop() (SIGTERM, then
// SIGKILL), when this process exits, and, should this process be killed outright, by
// timeout(1), which bounds the server's life.
import { spawn, execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";

export const FIXTURE = "../shared/fixtures/tiny-a";
const LIFETIME_S = 280;
const running = new Set();

function killAll() {
  for (const child of running) child.kill("SIGKILL");
}
process.on("exit", killAll);
for (const sig of ["SIGINT", "SIGTERM"]) {
  process.on(sig, () => {
    killAll();
    process.exit(130);
  });
}

export function binaryFromArgs() {
  const binary = process.argv[2];
  if (!binary) {
    console.error("usage: node <test>.mjs path/to/dsv4");
    process.exit(2);
  }
  return binary;
}

export async function startServer(binary, extraArgs = [], env = {}) {
  const args = ["serve", "-m", FIXTURE, "--numerics", "reference", "--threads", "1", "--host", "127.0.0.1", "--port", "0",
    ...extraArgs];
  const child = spawn("timeout", ["--kill-after=5", String(LIFETIME_S), binary, ...args], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, ...env },
  });
  running.add(child);
  let stdout = "";
  let stderr = "";
  child.stderr.on("data", (d) => { stderr += d; });
  const exited = new Promise((resolve) => child.on("exit", (code, signal) => {
    running.delete(child);
    resolve(code ?? 128 + (signal === "SIGKILL" ? 9 : 15));
  }));
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("dsv4 serve did not start in 60 s:\n" + stderr)), 60000);
    child.stdout.on("data", (d) => {
      stdout += d;
      const m = stdout.match(/listening on (http:\/\/127\.0\.0\.1:\d+)\//);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    exited.then((code) => reject(new Error(`dsv4 serve exited (${code}) before listening:\n${stderr}`)));
  });
  return {
    url,
    stderr: () => stderr,
    // The server process itself (the child of timeout), e.g. to read its /proc status.
    pid() {
      try {
        return Number(readFileSync(`/proc/${child.pid}/task/${child.pid}/children`, "utf8").trim().split(/\s+/)[0]);
      } catch {
        return Number(execFileSync("pgrep", ["-P", String(child.pid)]).toString().trim().split("\n")[0]);
      }
    },
    // SIGTERM (a clean shutdown; timeout passes it on), SIGKILL after 10 s. Returns the exit code.
    async stop() {
      if (!running.has(child)) return exited;
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 10000);
      const code = await exited;
      clearTimeout(timer);
      return code;
    },
  };
}

// Resident set size of a process in bytes (VmRSS of /proc/<pid>/status).
export function rssBytes(pid) {
  const m = readFileSync(`/proc/${pid}/status`, "utf8").match(/VmRSS:\s+(\d+) kB/);
  return Number(m[1]) * 1024;
}

// `dsv4 run --json` with the same model settings: what the CLI says the answer is.
export function runCli(binary, args) {
  const out = execFileSync(binary, ["run", "-m", FIXTURE, "--numerics", "reference", "--threads", "1", "--json", ...args],
    { stdio: ["ignore", "pipe", "ignore"] });
  return JSON.parse(out.toString());
}

// Token ids of `text` by `dsv4 tokenize` (the fixture's tokenizer; no BOS added).
export function tokenize(binary, text) {
  const out = execFileSync(binary, ["tokenize", "-t", `${FIXTURE}/tokenizer.json`], { input: text }).toString().trim();
  return out ? out.split(",").map(Number) : [];
}
