"""Headless Chromium (Debian's package; `make test` installs it where missing): load a page from a
file and read back what the browser laid out."""
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1100,1400"]

# Runs in the page after layout: which elements are rendered inside the first screen.
PROBE = """<script>
window.addEventListener('load', () => {
  const seen = sel => [...document.querySelectorAll(sel)].map(el => {
    const r = el.getBoundingClientRect(), s = getComputedStyle(el);
    return {text: el.textContent.trim().slice(0, 300), visible: r.width > 0 && r.height > 0 &&
            s.visibility !== 'hidden' && s.display !== 'none', top: r.top, height: r.height};
  });
  const matrix = [...document.querySelectorAll('#record-matrix tr[data-record]')].map(tr => ({
    record: tr.dataset.record, cells: [...tr.querySelectorAll('td.cell')].map(td => {
      const r = td.getBoundingClientRect();
      return {channel: td.dataset.channel, text: td.textContent.trim(), colour: getComputedStyle(td).color,
              visible: r.width > 0 && r.height > 0};
    })}));
  const out = document.createElement('pre'); out.id = 'probe';
  out.textContent = JSON.stringify({verdict: seen('#verdict'), charts: seen('svg'), evidence: seen('#evidence td'),
                                    secrets: seen('#secrets td'), fluency: seen('#degeneration td'),
                                    matrix, viewport: window.innerHeight});
  document.body.appendChild(out);
});
</script>"""


def chromium() -> str:
    path = shutil.which("chromium")
    assert path, "chromium is missing: `make test` installs Debian's chromium package"
    return path


def layout(page_html: str, screenshot: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "page.html"
        page.write_text(page_html.replace("</body>", PROBE + "</body>"))
        base = [chromium(), *FLAGS, f"--user-data-dir={tmp}/profile"]
        dom = subprocess.run(base + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
        if screenshot is not None:
            subprocess.run(base + [f"--screenshot={screenshot}", page.as_uri()], capture_output=True, timeout=120)
    start = dom.index('<pre id="probe">') + len('<pre id="probe">')
    import html
    return json.loads(html.unescape(dom[start:dom.index("</pre>", start)]))
