import { h, type ComponentChildren } from 'preact';
import { useEffect, useState } from 'preact/hooks';

const CHANGE = 'console:navigate';

/** The page's path, kept in step with the history (links, back and forward). */
export function usePath(): string {
  const [path, setPath] = useState(location.pathname);
  useEffect(() => {
    const update = () => setPath(location.pathname);
    addEventListener('popstate', update);
    addEventListener(CHANGE, update);
    return () => {
      removeEventListener('popstate', update);
      removeEventListener(CHANGE, update);
    };
  }, []);
  return path;
}

/** Moves to another page of the console without loading the document again. */
export function navigate(to: string, replace = false): void {
  history[replace ? 'replaceState' : 'pushState'](null, '', to);
  dispatchEvent(new Event(CHANGE));
  document.getElementById('main')?.focus();
}

/** The token an emailed link carries in its fragment (`#token=…`): a fragment never reaches a server. */
export function fragmentToken(): string | undefined {
  return new URLSearchParams(location.hash.slice(1)).get('token') ?? undefined;
}

export function Link(props: { href: string; children: ComponentChildren; current?: boolean }) {
  return h(
    'a',
    {
      href: props.href,
      'aria-current': props.current ? 'page' : undefined,
      onClick: (e: MouseEvent) => {
        if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
        e.preventDefault();
        navigate(props.href);
      },
    },
    props.children,
  );
}
