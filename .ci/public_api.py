#!/usr/bin/env python3
"""Lists a crate's public API from its rustdoc JSON, one item a line.

Usage: public_api.py CRATE.json > listing.txt

Every public path (re-exports followed), with each function's, field's and
constant's declaration as written in the source, each inherent method, each
enum variant and each trait the type implements (auto and blanket impls
left out). Items marked #[doc(hidden)] are not in the JSON, so the hidden
`seam` module is not listed. The listing is sorted, so it diffs cleanly.
"""
import json
import os
import re
import sys

doc = json.load(open(sys.argv[1]))
index = doc["index"]
paths = doc["paths"]
root_dir = os.getcwd()
lines = set()
_src = {}


def source(item):
    """The item's declaration as written: its first line(s) up to `{` or `;`."""
    span = item.get("span")
    if not span:
        return None
    fname = span["filename"]
    if not os.path.isabs(fname):
        fname = os.path.join(root_dir, fname)
    if fname not in _src:
        try:
            _src[fname] = open(fname).read().splitlines()
        except OSError:
            _src[fname] = []
    text = _src[fname]
    begin = span["begin"][0] - 1
    out = []
    for ln in text[begin : begin + 12]:
        s = ln.strip()
        if s.startswith("#[") or s.startswith("///") or s.startswith("//"):
            continue
        out.append(s)
        joined = " ".join(out)
        if re.search(r"(\{|;|,)\s*$", joined) or "where" in s:
            break
    decl = " ".join(out)
    decl = re.sub(r"\s*\{\s*$", "", decl)
    decl = re.sub(r"[;,]\s*$", "", decl)
    decl = re.sub(r"\s+", " ", decl).replace("( ", "(").replace(" )", ")").replace(",)", ")")
    return decl


def kind_of(item):
    return next(iter(item["inner"])) if isinstance(item["inner"], dict) else item["inner"]


def trait_name(t):
    return t["path"] if "path" in t else t.get("name", "?")


def walk_type(path, item):
    kind = kind_of(item)
    inner = item["inner"][kind]
    lines.add(f"{kind} {path}")
    if kind == "struct":
        fields = inner.get("kind", {}).get("plain", {}).get("fields", []) if isinstance(inner.get("kind"), dict) else []
        for fid in fields:
            f = index.get(str(fid))
            if f and f.get("visibility") == "public":
                lines.add(f"field {path}::{f['name']}: {source(f) or ''}")
    if kind == "enum":
        for vid in inner.get("variants", []):
            v = index.get(str(vid))
            if v:
                lines.add(f"variant {path}::{v['name']}")
    if kind == "trait":
        for mid in inner.get("items", []):
            m = index.get(str(mid))
            if m:
                lines.add(f"trait-item {path}::{m['name']}: {source(m) or ''}")
    for iid in inner.get("impls", []):
        imp = index.get(str(iid))
        if not imp:
            continue
        i = imp["inner"]["impl"]
        if i.get("is_synthetic") or i.get("blanket_impl"):
            continue
        if i.get("trait"):
            t = i["trait"]
            generic = (t.get("args") or {}).get("angle_bracketed", {}).get("args")
            decl = source(imp) if generic else None
            if decl and decl.startswith("impl"):
                lines.add(f"impl {path}: {decl}")
            else:
                lines.add(f"impl {trait_name(t)} for {path}")
            continue
        for mid in i.get("items", []):
            m = index.get(str(mid))
            if m and m.get("visibility") == "public":
                lines.add(f"{kind_of(m)} {path}::{m['name']}: {source(m) or ''}")


def walk(path, mid, seen):
    if mid in seen:
        return
    seen = seen | {mid}
    module = index[str(mid)]
    for cid in module["inner"]["module"]["items"]:
        item = index.get(str(cid))
        if item is None:
            continue
        kind = kind_of(item)
        if kind == "use":
            u = item["inner"]["use"]
            target = u.get("id")
            if u.get("is_glob"):
                if target is not None and str(target) in index:
                    walk(path, target, seen)
                continue
            name = u["name"]
            t = index.get(str(target)) if target is not None else None
            if t is None:
                ext = paths.get(str(target), {}) if target is not None else {}
                lines.add(f"use {path}::{name} = {'::'.join(ext.get('path', [u['source']]))}")
                continue
            item, kind = t, kind_of(t)
            sub = f"{path}::{name}"
        else:
            if item.get("visibility") != "public":
                continue
            sub = f"{path}::{item['name']}"
        if kind == "module":
            lines.add(f"mod {sub}")
            walk(sub, item["id"], seen)
        elif kind in ("struct", "enum", "trait", "union"):
            walk_type(sub, item)
        elif kind in ("function", "constant", "static", "type_alias", "macro"):
            lines.add(f"{kind} {sub}: {source(item) or ''}")
        else:
            lines.add(f"{kind} {sub}")


root = doc["root"]
walk(index[str(root)]["name"], root, frozenset())
print("\n".join(sorted(lines)))
