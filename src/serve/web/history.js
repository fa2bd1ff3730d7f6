// The gallery kept in the browser (IndexedDB "zimage", store "images"): each finished image with
// the settings that made it, so it survives a reload. Records: {key, blob, params, created}.
"use strict";

const historyDb = new Promise((resolve, reject) => {
  const open = indexedDB.open("zimage", 1);
  open.onupgradeneeded = () => open.result.createObjectStore("images", { keyPath: "key" });
  open.onsuccess = () => resolve(open.result);
  open.onerror = () => reject(open.error);
});

async function historyTx(mode, work) {
  const db = await historyDb;
  return new Promise((resolve, reject) => {
    const tx = db.transaction("images", mode);
    const result = work(tx.objectStore("images"));
    tx.oncomplete = () => resolve(result && "result" in result ? result.result : undefined);
    tx.onerror = () => reject(tx.error);
  });
}

const historyPut = (rec) => historyTx("readwrite", (s) => s.put(rec));
const historyDelete = (key) => historyTx("readwrite", (s) => s.delete(key));
const historyClear = () => historyTx("readwrite", (s) => s.clear());
const historyAll = () => historyTx("readonly", (s) => s.getAll());
