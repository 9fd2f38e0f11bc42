import { defineConfig } from "vitest/config";

// `npm run dev` serves the UI with hot reload and forwards /api to a workbench started with `make run`.
export default defineConfig({
  base: "/",
  build: { outDir: "dist", emptyOutDir: true, target: "es2022", chunkSizeWarningLimit: 400 },
  server: { proxy: { "/api": { target: "http://127.0.0.1:8000", changeOrigin: false } } },
  test: { include: ["src/**/*.test.ts"], environment: "node" },
});
