// Files for JavaScript plugins, through WASI's file system: the folders the pipeline grants
// (`capabilities = { dirs = [...] }`) are preopened, and nothing else exists.
//
// A plugin that imports this module must target a world that imports
// `wasi:filesystem/preopens@0.2.12` (see `plugins/js/wit/world.wit`). Reads and writes are
// positional (`pread`/`pwrite` style), so no stream is involved.

import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';

/** The WASI error code (`no-entry`, `access`, ...) of a thrown file-system error. */
export const errorCode = (e) => (e && typeof e === 'object' && 'payload' in e ? e.payload : e);

/** Why a file operation failed, as text. */
export const describe = (e) => {
  const code = errorCode(e);
  return typeof code === 'string' ? code : String(e?.message ?? e);
};

/** The granted folder that holds `path`, and `path` relative to it; null when none does. */
export function locate(path) {
  let best = null;
  for (const [dir, name] of getDirectories()) {
    const root = name.endsWith('/') ? name : `${name}/`;
    if (path.startsWith(root) && (best === null || root.length > best.root.length)) {
      best = { dir, root, relative: path.slice(root.length) };
    }
  }
  return best;
}

/** A file opened for reading and writing at byte offsets. */
export class File {
  constructor(descriptor) {
    this.descriptor = descriptor;
  }

  /** Opens `path` (an absolute guest path); `create` makes it if missing. Throws WASI errors. */
  static open(path, { create = false, truncate = false } = {}) {
    const place = locate(path);
    if (place === null) {
      throw 'no-entry';
    }
    const descriptor = place.dir.openAt({}, place.relative, { create, truncate }, { read: true, write: true });
    return new File(descriptor);
  }

  size() {
    return this.descriptor.stat().size;
  }

  setSize(size) {
    this.descriptor.setSize(size);
  }

  /** The whole file, or null when it does not exist. */
  static readAll(path) {
    let file;
    try {
      file = File.open(path);
    } catch (e) {
      if (errorCode(e) === 'no-entry') {
        return null;
      }
      throw e;
    }
    try {
      const [bytes] = file.descriptor.read(file.size(), 0n);
      return bytes;
    } finally {
      file.close();
    }
  }

  /** Writes all of `bytes` at `offset` (a BigInt); returns the offset after them. */
  writeAt(bytes, offset) {
    let done = 0;
    while (done < bytes.length) {
      done += Number(this.descriptor.write(bytes.subarray(done), offset + BigInt(done)));
    }
    return offset + BigInt(bytes.length);
  }

  sync() {
    this.descriptor.sync();
  }

  close() {
    this.descriptor[Symbol.dispose]?.();
  }

  /** Renames `from` to `to`, both absolute guest paths in the same granted folder. */
  static rename(from, to) {
    const a = locate(from);
    const b = locate(to);
    if (a === null || b === null) {
      throw 'no-entry';
    }
    a.dir.renameAt(a.relative, b.dir, b.relative);
  }

  /** Whether the folder `path` is reachable (granted and existing). */
  static folderExists(path) {
    const place = locate(path.endsWith('/') ? path : `${path}/`);
    if (place === null) {
      return false;
    }
    try {
      place.dir.statAt({}, place.relative === '' ? '.' : place.relative);
      return true;
    } catch {
      return false;
    }
  }
}
