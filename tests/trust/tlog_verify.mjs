// An independent verifier for pairreg's transparency log, written from the specifications
// (RFC 6962 / RFC 9162 §2.1.3.2 and §2.1.4.2, c2sp.org/signed-note, c2sp.org/tlog-checkpoint,
// c2sp.org/tlog-cosignature) and docs/transparency.md. It shares no code with pairreg: Node's
// own crypto module only, no packages.
//
// Input (stdin, JSON):
//   { "log_key": "<name>+<hex id>+<base64(0x01||key)>",
//     "witness_keys": ["<name>+<hex id>+<base64(0x04||key)>", ...],
//     "checkpoints": ["<signed note>", ...],
//     "inclusion": [{ "leaf_data", "leaf_index", "tree_size", "path": [hex], "root_hash" }],
//     "consistency": [{ "old_size", "new_size", "old_root", "new_root", "path": [hex] }] }
// Output (stdout, JSON): one verdict per item; a verdict never throws, it says why.

import { createHash, createPublicKey, verify } from "node:crypto";

const sha256 = (...parts) => {
  const h = createHash("sha256");
  for (const p of parts) h.update(p);
  return h.digest();
};
const leafHash = (data) => sha256(Buffer.from([0]), data);
const nodeHash = (l, r) => sha256(Buffer.from([1]), l, r);
const hex = (s) => Buffer.from(s, "hex");

// --- RFC 9162 §2.1.3.2: verify an inclusion proof --------------------------------------
function verifyInclusion(leaf, index, size, path, root) {
  if (!(index >= 0 && index < size)) return false;
  let fn = BigInt(index);
  let sn = BigInt(size - 1);
  let r = leaf;
  for (const p of path) {
    if (sn === 0n) return false;
    if ((fn & 1n) === 1n || fn === sn) {
      r = nodeHash(p, r);
      while ((fn & 1n) === 0n && fn !== 0n) {
        fn >>= 1n;
        sn >>= 1n;
      }
    } else {
      r = nodeHash(r, p);
    }
    fn >>= 1n;
    sn >>= 1n;
  }
  return sn === 0n && r.equals(root);
}

// --- RFC 9162 §2.1.4.2: verify a consistency proof -------------------------------------
function verifyConsistency(first, second, firstHash, secondHash, proof) {
  if (first > second) return false;
  if (first === second) return proof.length === 0 && firstHash.equals(secondHash);
  if (first === 0) return proof.length === 0; // the empty tree is a prefix of every tree
  if (proof.length === 0) return false;
  let path = proof;
  if ((first & (first - 1)) === 0) path = [firstHash, ...proof]; // exact power of two
  let fn = BigInt(first - 1);
  let sn = BigInt(second - 1);
  while ((fn & 1n) === 1n) {
    fn >>= 1n;
    sn >>= 1n;
  }
  let fr = path[0];
  let sr = path[0];
  for (const c of path.slice(1)) {
    if (sn === 0n) return false;
    if ((fn & 1n) === 1n || fn === sn) {
      fr = nodeHash(c, fr);
      sr = nodeHash(c, sr);
      while ((fn & 1n) === 0n && fn !== 0n) {
        fn >>= 1n;
        sn >>= 1n;
      }
    } else {
      sr = nodeHash(sr, c);
    }
    fn >>= 1n;
    sn >>= 1n;
  }
  return fr.equals(firstHash) && sr.equals(secondHash) && sn === 0n;
}

// --- c2sp.org/signed-note verifier keys and signatures ---------------------------------
const ED25519_SPKI = hex("302a300506032b6570032100");

function parseVkey(vkey) {
  // name+hexid+base64: the base64 part may contain "+" itself, so cut at the first two.
  const a = vkey.indexOf("+");
  const b = vkey.indexOf("+", a + 1);
  if (a < 0 || b < 0) throw new Error(`bad verifier key ${vkey}`);
  const [name, id, b64] = [vkey.slice(0, a), vkey.slice(a + 1, b), vkey.slice(b + 1)];
  const data = Buffer.from(b64, "base64");
  if (data.length !== 33) throw new Error(`verifier key ${name}: not an Ed25519 key`);
  const computed = sha256(Buffer.from(name + "\n", "utf8"), data).subarray(0, 4);
  if (computed.toString("hex") !== id) throw new Error(`verifier key ${name}: wrong key ID`);
  const key = createPublicKey({
    key: Buffer.concat([ED25519_SPKI, data.subarray(1)]),
    format: "der",
    type: "spki",
  });
  return { name, id: computed, type: data[0], key };
}

function splitNote(note) {
  if (!note.endsWith("\n")) throw new Error("note does not end in a newline");
  const cut = note.lastIndexOf("\n\n");
  if (cut < 0) throw new Error("no blank line before the signatures");
  const text = note.slice(0, cut + 1);
  const sigs = note
    .slice(cut + 2)
    .split("\n")
    .filter((l) => l.length > 0)
    .map((line) => {
      if (!line.startsWith("\u2014 ")) throw new Error(`bad signature line ${line}`);
      const [name, b64] = line.slice(2).split(" ");
      const raw = Buffer.from(b64, "base64");
      return { name, id: raw.subarray(0, 4), sig: raw.subarray(4) };
    });
  return { text, sigs };
}

// Returns { verified: {name: timestamp|null} } or throws.
function verifyNote(note, vkeys) {
  const { text, sigs } = splitNote(note);
  const verified = {};
  for (const s of sigs) {
    const k = vkeys.find((v) => v.name === s.name && v.id.equals(s.id));
    if (!k) continue; // unknown keys are ignored
    let message;
    let signature;
    let stamp = null;
    if (k.type === 0x01) {
      message = Buffer.from(text, "utf8");
      signature = s.sig;
    } else if (k.type === 0x04) {
      if (s.sig.length !== 72) throw new Error(`cosignature from ${s.name}: wrong length`);
      stamp = s.sig.readBigUInt64BE(0);
      message = Buffer.from(`cosignature/v1\ntime ${stamp}\n${text}`, "utf8");
      signature = s.sig.subarray(8);
    } else {
      throw new Error(`unsupported signature type ${k.type}`);
    }
    if (!verify(null, message, k.key, signature)) {
      throw new Error(`signature from ${s.name} does not verify`);
    }
    verified[s.name] = stamp === null ? null : Number(stamp);
  }
  if (Object.keys(verified).length === 0) throw new Error("no signature from a known key");
  return { text, verified };
}

// --- c2sp.org/tlog-checkpoint ----------------------------------------------------------
function checkCheckpoint(note, logKey, witnessKeys) {
  try {
    const { text, verified } = verifyNote(note, [logKey, ...witnessKeys]);
    if (!(logKey.name in verified)) throw new Error("not signed by the log");
    const lines = text.split("\n").slice(0, -1);
    if (lines.length < 3) throw new Error("fewer than three lines");
    const [origin, sizeLine, rootLine] = lines;
    if (origin !== logKey.name) throw new Error(`origin ${origin} is not the log's name`);
    if (!/^(0|[1-9][0-9]*)$/.test(sizeLine)) throw new Error(`bad tree size ${sizeLine}`);
    const root = Buffer.from(rootLine, "base64");
    if (root.length !== 32) throw new Error("root is not 32 bytes");
    return {
      ok: true,
      origin,
      size: Number(sizeLine),
      root: root.toString("hex"),
      signers: Object.keys(verified).sort(),
      cosigned_at: Object.fromEntries(
        Object.entries(verified).filter(([, t]) => t !== null),
      ),
    };
  } catch (e) {
    return { ok: false, reason: e.message };
  }
}

const input = JSON.parse(await new Promise((resolve) => {
  let data = "";
  process.stdin.on("data", (c) => (data += c));
  process.stdin.on("end", () => resolve(data));
}));
const logKey = parseVkey(input.log_key);
const witnessKeys = (input.witness_keys || []).map(parseVkey);
const out = {
  log: { name: logKey.name, id: logKey.id.toString("hex") },
  checkpoints: (input.checkpoints || []).map((n) => checkCheckpoint(n, logKey, witnessKeys)),
  inclusion: (input.inclusion || []).map((p) => {
    const data = Buffer.from(p.leaf_data, "utf8");
    const event = JSON.parse(p.leaf_data);
    return {
      ok:
        event.seq === p.leaf_index + 1 &&
        verifyInclusion(leafHash(data), p.leaf_index, p.tree_size, p.path.map(hex), hex(p.root_hash)),
      leaf_hash: leafHash(data).toString("hex"),
    };
  }),
  consistency: (input.consistency || []).map((p) => ({
    ok: verifyConsistency(
      p.old_size,
      p.new_size,
      hex(p.old_root),
      hex(p.new_root),
      p.path.map(hex),
    ),
  })),
};
process.stdout.write(JSON.stringify(out));
