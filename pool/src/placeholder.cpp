// Placeholder translation unit: kiln::pool has no code yet (see its CMakeLists.txt).
namespace kiln::pool_placeholder {
int unused = 0;
}
