// Minimal declarations of Node.js's globals and built-in modules, so that
// programs using process, require or "fs" compile without @types/node
// (which Debian does not package). Everything is loosely typed; install
// @types/node in a project for the real thing.
declare var process: any;
declare var require: any;
declare var module: any;
declare var exports: any;
declare var __dirname: string;
declare var __filename: string;
declare var Buffer: any;
declare var global: any;
declare module "assert";
declare module "buffer";
declare module "child_process";
declare module "crypto";
declare module "events";
declare module "fs";
declare module "fs/promises";
declare module "http";
declare module "https";
declare module "net";
declare module "os";
declare module "path";
declare module "readline";
declare module "stream";
declare module "url";
declare module "util";
declare module "zlib";
declare module "node:*";
