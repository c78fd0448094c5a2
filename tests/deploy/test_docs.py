"""The product's documents: docs/benchmarks.md is what docs/make_benchmarks.py makes of tests/gpu/results (each
result dated with its machine, commit and command), the README keeps its two commands (and CI runs exactly the
test one) and the sections other tools replace, and the documents describe the product, not how the work on
it was organised."""
import json
import re
import subprocess
import sys

from conftest import SRC

RESULTS = SRC / "tests" / "gpu" / "results"
NARRATION = re.compile(r"\bsessions? \d+|\bwork period|\bnvidia-h[12]00-x\d|\bleases?\b|\brented\b|\brental\b|"
                       r"(?<!can )\b[Ii]ssue \d+\b|\bhelpers?'s? (branch|session)", re.I)


def test_benchmarks_md_is_generated_from_the_results():
    r = subprocess.run([sys.executable, str(SRC / "docs" / "make_benchmarks.py"), "--check"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_each_result_names_its_date_machine_commit_and_command():
    folders = [d for d in RESULTS.iterdir() if d.is_dir()]
    assert folders and not [f for f in RESULTS.iterdir() if f.is_file()], "results live in one folder each"
    text = (SRC / "docs" / "benchmarks.md").read_text()
    for d in folders:
        meta = json.loads((d / "meta.json").read_text())
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", meta["date"]), d
        assert re.fullmatch(r"[0-9a-f]{7,40}", meta["commit"]), d
        assert meta["machine"] and meta["command"] and meta["title"] in text
        assert f"Measured {meta['date']} on {meta['machine']}, commit `{meta['commit']}`." in text
        assert [p for p in d.iterdir() if p.name != "meta.json"], f"{d}: no raw result"


def test_readme_two_commands_and_replaceable_sections():
    readme = (SRC / "README.md").read_text()
    assert "bash deploy/quickstart.sh" in readme and "bash tests/run.sh" in readme
    ci = (SRC / ".ci" / "run").read_text()
    assert [l for l in ci.splitlines() if "tests/run.sh" in l] == ["exec bash tests/run.sh"]
    for section in ("## Supported model families", "## Quantization types"):
        body = readme.split(section + "\n", 1)[1].split("\n## ", 1)[0]
        assert body.strip() and "TODO" not in body and "placeholder" not in body.lower(), section
    assert len(readme.splitlines()) < 260
    for link in re.findall(r"\]\(((?:docs|deploy)/[^)#]+)", readme):
        assert (SRC / link).exists(), link


def test_documents_do_not_narrate_how_the_work_was_organised():
    files = [SRC / "README.md", SRC / "runtime" / "NOTES.md", SRC / "kernels" / "cpu" / "NOTES.md",
             SRC / "kernels" / "cuda" / "NOTES.md", SRC / "deploy" / "README.md"]
    files += sorted((SRC / "docs").glob("*.md")) + sorted(RESULTS.rglob("*"))
    hits = []
    for f in files:
        if f.is_file():
            for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                if NARRATION.search(line):
                    hits.append(f"{f.relative_to(SRC)}:{i}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits[:20])
