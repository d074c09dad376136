"""A first-visit tour of the page: six stops, each pointing at a part of the page with one or two sentences. It opens
by itself on a visitor's first visit (the browser remembers that it was seen) and reopens from the header's
"Take the tour" button. The panel sits in the corner of the window where it covers least of the part it points at
and of the streams, and blocks nothing: the page works while it is open.
"""
from __future__ import annotations

import json

from ..render import asset

STOPS = (
    ("#mirror-prompt", "1 · Prompt and Run",
     "Type a prompt or pick an example, then press Run: the target alone (AR), Mirror-SD and vanilla SD decode it "
     "one after another, each with the machine to itself, three times; the page holds still while each is timed."),
    ("#mirror-tokens-mirror", "2 · The streams",
     "Each decoder's text as it is committed, coloured by where each token came from: accepted draft tokens, tokens "
     "from a reused branch, the target's corrections and bonus tokens; rejected drafts are struck through."),
    ("#mirror-plots", "3 · Plots",
     "Per verification step: tokens committed (hit or miss), both lanes' busy spans on one clock (the draft working "
     "while the target finishes its layers), the race against AR, and acceptance by position, replayed at the "
     "measured pace once the runs are timed. Hover for numbers."),
    ("#mirror-numbers", "4 · Numbers",
     "τ (tokens per step), α (acceptance), hit rate, draft-hidden fraction, speedup: each with its definition, and "
     "beside them the latency model computed from the same spans (labelled modelled)."),
    ("#mirror-inspector", "5 · Step inspector",
     "One verification step up close: the window, each slot's early-exit candidates, the branches the draft rolled "
     "out, and whether the correction hit one."),
    ("button[role=tab]", "6 · The Learn tab",
     "Play one real step slowly, see its branch tree, run small experiments that redraw the paper's trade-offs, "
     "and ask what other hardware would change. The glossary defines every term."),
)

TEMPLATE = ("<button id='mirror-tour-open' class='mirror-tour-open'>Take the tour</button>"
            "<div id='mirror-tour-panel' class='mirror-tour' hidden><div class='mirror-tour-title'></div>"
            "<div class='mirror-tour-text'></div><div class='mirror-tour-nav'><button data-go='-1'>Back</button>"
            "<button data-go='1'>Next</button><button data-go='0'>Close</button></div></div>")

JS = """
const stops = JSON.parse(props.value || '[]');
const panel = element.querySelector('#mirror-tour-panel');
let at = 0, marked = null;
function show(i) {
  at = Math.max(0, Math.min(i, stops.length - 1));
  const [sel, title, text] = stops[at];
  panel.querySelector('.mirror-tour-title').textContent = title;
  panel.querySelector('.mirror-tour-text').textContent = text;
  panel.querySelector("[data-go='1']").textContent = at === stops.length - 1 ? 'Done' : 'Next';
  panel.hidden = false;
  if (marked) marked.classList.remove('mirror-tour-mark');
  marked = sel === 'button[role=tab]'
    ? [...document.querySelectorAll(sel)].find(b => b.textContent.trim() === 'Learn') : document.querySelector(sel);
  if (marked) { marked.classList.add('mirror-tour-mark'); marked.scrollIntoView({block: 'center', behavior: 'smooth'}); }
  place();
  setTimeout(place, 600);  // again once the smooth scroll has ended
}
function place() {
  // The corner that covers least of the marked part and of the streams (a phone keeps its CSS: full width, bottom).
  if (panel.hidden || innerWidth <= 640) return;
  const avoid = [marked, ...document.querySelectorAll("[id^=mirror-tokens-]")].filter(Boolean)
    .map(e => e.getBoundingClientRect());
  const w = panel.offsetWidth, h = panel.offsetHeight, m = 16;
  const corners = [[innerWidth - w - m, innerHeight - h - m], [innerWidth - w - m, m], [m, innerHeight - h - m], [m, m]];
  const covered = ([x, y]) => avoid.reduce((sum, r) => sum + Math.max(0, Math.min(x + w, r.right) - Math.max(x, r.left))
    * Math.max(0, Math.min(y + h, r.bottom) - Math.max(y, r.top)), 0);
  const [x, y] = corners.reduce((best, c) => covered(c) < covered(best) ? c : best);
  Object.assign(panel.style, {left: x + "px", top: y + "px", right: "auto", bottom: "auto"});
}
let placing = false;
addEventListener("scroll", () => {
  if (placing) return;
  placing = true;
  requestAnimationFrame(() => { placing = false; place(); });
}, {passive: true});
function close() {
  panel.hidden = true;
  if (marked) marked.classList.remove('mirror-tour-mark');
  try { localStorage.setItem('mirror-tour-seen', '1'); } catch (e) {}
}
panel.addEventListener('click', (e) => {
  const go = e.target.getAttribute && e.target.getAttribute('data-go');
  if (go === null) return;
  if (go === '0' || (go === '1' && at === stops.length - 1)) close(); else show(at + Number(go));
});
element.querySelector('#mirror-tour-open').addEventListener('click', () => show(0));
let seen = false;
try { seen = localStorage.getItem('mirror-tour-seen') === '1'; } catch (e) {}
if (!seen) setTimeout(() => show(0), 800);
"""

CSS = asset("learn/tour.css")  # the tour panel's styles (ui/learn/tour.css)


def stops_json() -> str:
    return json.dumps([list(s) for s in STOPS])
