// Placeholder translation unit: kiln::cache has no code yet (see its CMakeLists.txt).
namespace kiln::cache_placeholder {
int unused = 0;
}
