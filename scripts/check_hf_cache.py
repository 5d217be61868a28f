#!/usr/bin/env python3
"""Check that huggingface_hub reads a Hugging Face cache that `kiln pull` made.

usage: check_hf_cache.py CACHE_DIR REPO_ID [REPO_ID ...]

For each repository, offline (HF_HUB_OFFLINE=1, local_files_only=True):
snapshot_download finds the snapshot, hf_hub_download finds each of its
files there, and every blob's name is the digest of its bytes (sha256 for
LFS files, the git blob id for the rest), as huggingface_hub names them.
Then scan_cache_dir must read the whole cache without a warning. Prints the
files; exits 1 on any failure.

Make the cache with kiln's test hub (no internet needed), where Go is:
    KILN_HF_CACHE_OUT=$PWD/.carry/hf go test -count=1 -run TestLeaveCache ./hub
    tar -C .carry -cf .carry/hf.tar hf
and where huggingface_hub is:
    mkdir -p /tmp/hfc && tar -C /tmp/hfc -xf .carry/hf.tar
    python3 scripts/check_hf_cache.py /tmp/hfc/hf kiln-test/demo kiln-test/qwen3-w256-GGUF
"""
import hashlib
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # read before huggingface_hub is imported

import huggingface_hub  # noqa: E402
from huggingface_hub import hf_hub_download, scan_cache_dir, snapshot_download  # noqa: E402


def digest_of(path, name):
    """The digest huggingface_hub names a blob by, of the kind name has."""
    data = open(path, "rb").read()
    if len(name) == 64:
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cache, repos = sys.argv[1], sys.argv[2:]
    print(f"huggingface_hub {huggingface_hub.__version__}, cache {cache}")
    failed = False
    for repo in repos:
        snap = snapshot_download(repo, cache_dir=cache, local_files_only=True)
        print(f"{repo}: snapshot_download -> {snap}")
        for root, _, files in os.walk(snap):
            for f in sorted(files):
                path = os.path.join(root, f)
                name = os.path.relpath(path, snap)
                link = os.readlink(path) if os.path.islink(path) else "(not a link)"
                blob = os.path.basename(link)
                got = hf_hub_download(repo, name, cache_dir=cache, local_files_only=True)
                ok = os.path.islink(path) and not os.path.isabs(link) and got == path and digest_of(path, blob) == blob
                failed |= not ok
                print(f"  {'ok ' if ok else 'BAD'} {name:40} {os.path.getsize(path):>10}  -> {link}")
    info = scan_cache_dir(cache)
    for r in sorted(info.repos, key=lambda r: r.repo_id):
        for rev in r.revisions:
            print(f"scan_cache_dir: {r.repo_id} {rev.commit_hash[:12]} refs={sorted(rev.refs)} files={rev.nb_files} size={rev.size_on_disk}")
    for w in info.warnings:
        failed = True
        print(f"scan_cache_dir warning: {w}")
    missing = set(repos) - {r.repo_id for r in info.repos}
    if missing:
        failed = True
        print(f"scan_cache_dir did not find {sorted(missing)}")
    print("FAILED" if failed else "OK: huggingface_hub reads kiln's cache")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
