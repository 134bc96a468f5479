// Placeholder translation unit: kiln::runtime has no code yet (see its CMakeLists.txt).
namespace kiln::runtime_placeholder {
int unused = 0;
}
