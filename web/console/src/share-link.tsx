import { useEffect, useRef, useState } from 'preact/hooks';

/**
 * A share link as people use it: a real link (opened in a new tab, no Referer), and a Copy button. The
 * clipboard needs a secure context and permission; where it is refused, the link is put in a selected
 * read-only field to copy by hand. The state is said aloud as well as shown.
 */
export function ShareLink({ url, name }: { url: string; name: string }) {
  const [state, setState] = useState<'idle' | 'copied' | 'select'>('idle');
  const field = useRef<HTMLInputElement>(null);
  useEffect(() => {
    if (state === 'select') field.current?.select();
  }, [state]);
  return (
    <span class="share-link">
      <a href={url} target="_blank" rel="noopener noreferrer">
        {url}
      </a>{' '}
      <button
        type="button"
        class="secondary"
        onClick={async () => {
          try {
            await navigator.clipboard.writeText(url);
            setState('copied');
          } catch {
            setState('select');
          }
        }}
      >
        {state === 'copied' ? 'Copied' : 'Copy'}
        <span class="visually-hidden"> {name}</span>
      </button>
      {state === 'select' && (
        <input ref={field} class="mono" readOnly value={url} aria-label={`${name}: press Ctrl+C (⌘C) to copy`} onFocus={(e) => e.currentTarget.select()} />
      )}
      <span class="visually-hidden" role="status">
        {state === 'copied' ? 'Link copied.' : state === 'select' ? 'Copying was refused: the link is selected, copy it by hand.' : ''}
      </span>
    </span>
  );
}
