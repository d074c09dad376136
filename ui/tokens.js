// One decoder's stream box. The value is the stream's whole HTML or what grew since the last update (ui/delta.js):
// a delta is appended (O(new) per update), and so is a whole value's end when it starts with what the box shows;
// another whole value replaces the box.
// A delta that does not start where the box ends (an update Gradio did not deliver) is appended after a gap mark;
// the event's last value is whole and puts the box right.
let shown = "", end = 0, follow = true, pending = false;  // shown: the whole HTML in the box ("" after a gap); end: its length as sent
element.addEventListener('scroll', (e) => {
  const b = e.target;
  if (b.classList && b.classList.contains('mirror-tokens')) follow = b.scrollTop + b.clientHeight >= b.scrollHeight - 8;
}, true);
const GAP = '<span class="mirror-gap" title="updates missed here (the box was hidden): the whole stream shows when ' +
            'the run or replay ends">…</span>';
function sync() {
  const box = element.querySelector('.mirror-tokens'), d = delta(props.value);
  if (!box) return;
  if (d.whole && end === shown.length && d.chunk.startsWith(shown)) {  // what the box shows, and perhaps more
    if (d.chunk.length === end) return;
    box.insertAdjacentHTML('beforeend', d.chunk.slice(end));
    shown = d.chunk;
  } else if (d.whole) {
    box.innerHTML = d.chunk;
    shown = d.chunk;
  } else if (d.start === end) {
    if (!d.chunk) return;
    box.insertAdjacentHTML('beforeend', d.chunk);
    if (shown.length === end) shown += d.chunk;
  } else {
    box.insertAdjacentHTML('beforeend', GAP + d.chunk);
    shown = "";
  }
  end = d.start + d.chunk.length;
  if (follow && !pending) {  // at the next frame: reading scrollHeight now would lay the whole box out in this task
    pending = true;
    requestAnimationFrame(() => { pending = false; if (follow) box.scrollTop = box.scrollHeight; });
  }
}
watch('value', sync);
sync();
