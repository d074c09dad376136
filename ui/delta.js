// An append-only view's value as ui/views.py (Deltas) sends it: the whole text, or "+START CHUNK", the text from
// character START on (what grew since the event's previous value). Shared by ui/tokens.js and ui/live_plots.js.
// Whole texts never start with "+" (HTML starts with "<", the plots' feed with a record's letter).
function delta(value) {
  if (!value || value[0] !== "+") return {start: 0, chunk: value || "", whole: true};
  const cut = value.indexOf(" ");
  return {start: Number(value.slice(1, cut)), chunk: value.slice(cut + 1), whole: false};
}
