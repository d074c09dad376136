"""The Learn tab (tab.py: build and wire) and what only it shows: the step player and the branch tree over a run or
the recorded example, the experiments, the what-if with its speedup curve, the roofline, the glossary and the
first-visit tour. The Run tab, the layout and the views both tabs share stay in ui/."""
