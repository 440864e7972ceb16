// Preloaded into the test processes of `make sanitize`: dlclose does nothing,
// so libraries loaded at run time (cuDNN's engine libraries, the CUDA driver
// stub, OpenMPI's components) stay mapped until the process ends. Unmapped,
// the pointers their globals hold vanish from LeakSanitizer's view at exit and
// their live buffers are reported as leaks from "<unknown module>"; mapped,
// only memory nothing points to is. Built without the sanitizers (it loads
// before their runtime).
extern "C" int dlclose(void* handle) {
  (void)handle;
  return 0;
}
