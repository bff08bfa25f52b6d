/**
 * The layout's one piece of script: on a narrow screen every table is shown as a list of stacked rows
 * (app.css), each cell under its column's name. The name comes from the cell's `data-label`, which this
 * fills in from the table's column headers wherever a page did not set one, so each page's table markup
 * stays plain. It runs on every change of the page's DOM (a MutationObserver), before the browser paints.
 */
export function labelTableCells(root: HTMLElement): void {
  const label = () => {
    for (const table of root.querySelectorAll('table')) {
      const heads = table.tHead?.rows[table.tHead.rows.length - 1];
      if (!heads) continue;
      const names: string[] = [];
      for (const th of heads.cells) for (let i = 0; i < th.colSpan; i++) names.push(th.textContent?.trim() ?? '');
      for (const body of table.tBodies)
        for (const row of body.rows) {
          let column = 0;
          for (const cell of row.cells) {
            // A cell across columns (a row's details) belongs to none of them.
            if (cell.tagName === 'TD' && cell.colSpan === 1 && !cell.hasAttribute('data-label') && names[column])
              cell.setAttribute('data-label', names[column]);
            column += cell.colSpan;
          }
        }
    }
  };
  label();
  // Setting the attributes is a mutation of attributes only, which this observer does not watch: no loop.
  new MutationObserver(label).observe(root, { childList: true, subtree: true });
}
