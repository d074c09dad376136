let shown = "", follow = true;
element.addEventListener('scroll', (e) => {
  const b = e.target;
  if (b.classList && b.classList.contains('mirror-tokens')) follow = b.scrollTop + b.clientHeight >= b.scrollHeight - 8;
}, true);
function sync() {
  const box = element.querySelector('.mirror-tokens'), value = props.value || '';
  if (!box || value === shown) return;
  if (shown && value.startsWith(shown)) box.insertAdjacentHTML('beforeend', value.slice(shown.length));
  else box.innerHTML = value;
  shown = value;
  if (follow) box.scrollTop = box.scrollHeight;
}
watch('value', sync);
sync();
